"""``cronoq-operator``: scales worker Deployments from each pool's desired capacity.

A ``CronoqWorkerScaler`` (``cronoq.io/v1alpha1``) names a server of the operator's own
configuration, a pool and a Deployment. Every ``intervalSeconds`` the operator reads the pool's
desired capacity in slots from that server (``Admin.Snapshot`` with a metrics token, merged over
every shard) and sets the Deployment's replicas, through its scale subresource, to
``ceil(desired / slotsPerReplica)`` clamped to ``[minReplicas, maxReplicas]``. When the server
cannot be read or does not report the pool, the Deployment is left alone; a lower target is only
applied once every reading of ``scaleDownStabilizationSeconds`` asked for it, so a dip (a
failover, a restart of the operator) never takes workers away. The scaler's status shows the
desired slots, the replicas set and why.

The parts: ``settings`` (the operator's configuration: servers, URLs, tokens), ``decide`` (the
rules, pure), ``reading`` (asking a cronoq server), ``kube`` (the few Kubernetes calls), ``main``
(the kopf wiring and the loop). Install with ``pip install 'cronoq[operator]'``.
"""

__all__: list[str] = []
