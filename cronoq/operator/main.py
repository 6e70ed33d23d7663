"""``cronoq-operator``: the kopf wiring of ``cronoq.operator.control``.

    cronoq-operator [--config PATH] [--namespace NS ...] [--liveness URL]
    cronoq-operator --config PATH --check

kopf watches the ``CronoqWorkerScaler`` objects (every namespace, or the ones given) and tells
``Control`` about each change; ``Control`` runs the scaling rounds. The operator needs no more
than its ClusterRole grants: it posts no Events, watches no CRDs or namespaces, adds no finalizer
and never patches a scaler except its status (kopf's event handlers are the only ones used).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import kopf

from .control import Control
from .kube import GROUP, PLURAL, VERSION, Kube
from .settings import OperatorSettings, SettingsError, load

__all__ = ["main", "prepare"]

log = logging.getLogger("cronoq.operator")

DEFAULT_CONFIG = "/etc/cronoq-operator/operator.toml"


class Memo(kopf.Memo):
    """What the handlers share (kopf hands every handler this object as ``memo``)."""

    settings: OperatorSettings
    control: Control | None
    task: asyncio.Task[None] | None


def prepare(settings: kopf.OperatorSettings) -> None:
    """kopf's settings for an operator that only watches scalers and writes their status."""
    settings.posting.enabled = False  # no Events (the ClusterRole grants none)
    settings.scanning.disabled = True  # no CRD or namespace watching (idem)
    settings.peering.standalone = True  # one replica; no KopfPeering objects
    settings.watching.server_timeout = 600


@kopf.on.startup()
async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    prepare(settings)


@kopf.on.login()
async def _login(memo: Memo, **kwargs: Any) -> Any:
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is not None and memo.control is None:
        memo.control = Control(memo.settings, Kube(info))
        memo.task = asyncio.get_running_loop().create_task(memo.control.run(), name="cronoq-operator-rounds")
    return info


@kopf.on.event(GROUP, VERSION, PLURAL)
def _scaler_event(event: kopf.RawEvent, memo: Memo, namespace: str | None, name: str, **_: Any) -> None:
    control = memo.control
    if control is None or namespace is None:
        return
    if event.get("type") == "DELETED":
        control.gone(namespace, name)
        return
    body: dict[str, Any] = dict(event.get("object") or {})
    metadata = body.get("metadata") or {}
    control.seen(namespace, name, body.get("spec") or {}, metadata.get("generation"), body.get("status") or {})


@kopf.on.cleanup()
async def _cleanup(memo: Memo, **_: Any) -> None:
    if memo.task is not None:
        memo.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await memo.task
    if memo.control is not None:
        await memo.control.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cronoq-operator", description="Scale worker Deployments from cronoq pools' desired capacity."
    )
    parser.add_argument(
        "--config",
        default=os.environ.get("CRONOQ_OPERATOR_CONFIG", DEFAULT_CONFIG),
        help=f"the operator's TOML configuration (default: $CRONOQ_OPERATOR_CONFIG or {DEFAULT_CONFIG})",
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch scalers in this namespace only (repeatable; default: every namespace)",
    )
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        help="liveness endpoint (default: http://0.0.0.0:8080/healthz)",
    )
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load(args.config)
    except SettingsError as error:
        print(f"cronoq-operator: {args.config}: {error}", file=sys.stderr)
        return 2
    if args.check:
        print(f"configuration is valid: servers {', '.join(settings.servers)}")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    memo = Memo(settings=settings, control=None, task=None)
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
        memo=memo,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
