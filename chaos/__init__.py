"""Failover drills (``cronoq chaos``): real clusters under load, faults injected, histories checked.

``cronoq.chaos.drills`` registers the drills, ``run`` runs one, ``checker`` judges what was recorded,
``report`` writes what a person reads. See the README section "Failover drills"."""
