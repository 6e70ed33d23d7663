"""The web console: pages at ``/ui/`` of every node's HTTP listener, and the HTTP calls they use.

The pages (``static/``: plain ES modules, no build step, no asset from anywhere else) talk to
the HTTP API of the node that served them, on the same origin, with the bearer token the user
types in (kept in the tab's ``sessionStorage``, sent only in the ``authorization`` header).
What they show follows the token's role: the metrics role sees shards, pools and their charts,
workers and schedules; the client role searches tasks, opens a task's page, cancels it and
follows the live event stream; admin sees everything and pauses, resumes and removes schedules.
The server enforces the same rules on every call (``cronoq.server.http.ROUTES``).

- ``handlers``: the gateway's handlers for the console's routes and files.
- ``events``: the Watch stream over HTTP as newline-delimited JSON.
- ``shapes``: the JSON of task details, shards, schedules and events.
- ``assets``: the files, served from memory with a strict Content-Security-Policy.
- ``openapi``: the API routes' part of ``/v1/openapi.json``.
"""
