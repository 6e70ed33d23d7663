"""cronoq.server: the ``cronoq-server`` process and the layers the transports share.

``convert`` (protobuf <-> domain), ``errors`` (one ``ApiError`` with gRPC and HTTP statuses),
``auth`` (principals, roles, pool scopes), ``api`` (transport-independent handlers),
``grpc_service`` (the gRPC servicers), ``metrics`` (Prometheus text), ``app`` / ``main`` (the
process). Import the submodules you need; this package imports nothing on its own.
"""
