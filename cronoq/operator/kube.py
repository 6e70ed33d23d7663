"""The three Kubernetes calls the operator makes, over aiohttp with kopf's credentials.

- read a Deployment's replicas: ``GET apps/v1 deployments/{name}/scale``;
- set them: ``PATCH`` the same scale subresource (a merge patch of ``spec.replicas``);
- report on a scaler: ``PATCH cronoq.io/v1alpha1 cronoqworkerscalers/{name}/status``.

These are exactly what the operator's ClusterRole grants (plus reading and watching the
scalers, which kopf does). Inside a pod the service-account token is read again for every call,
since the kubelet rotates it.
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

__all__ = ["GROUP", "PLURAL", "VERSION", "Kube", "KubeError"]

GROUP = "cronoq.io"
VERSION = "v1alpha1"
PLURAL = "cronoqworkerscalers"

SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _ssl_context(info: Any) -> ssl.SSLContext | bool:
    if info.insecure:
        return False
    context = ssl.create_default_context()
    if info.ca_path:
        context.load_verify_locations(cafile=info.ca_path)
    elif info.ca_data:
        data = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
        context.load_verify_locations(cadata=data)
    if info.certificate_path and info.private_key_path:
        context.load_cert_chain(info.certificate_path, info.private_key_path)
    return context


class Kube:
    """Calls to the API server named by a kopf ``ConnectionInfo``."""

    def __init__(self, info: Any, *, timeout: float = 10.0) -> None:
        self.server = str(info.server).rstrip("/")
        self._token: str | None = info.token
        self._token_file = SERVICE_ACCOUNT_TOKEN if info.token and SERVICE_ACCOUNT_TOKEN.exists() else None
        self._ssl = _ssl_context(info)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"accept": "application/json"}
        token = self._token_file.read_text().strip() if self._token_file is not None else self._token
        if token:
            headers["authorization"] = f"Bearer {token}"
        if content_type:
            headers["content-type"] = content_type
        return headers

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        data = None if body is None else json.dumps(body)
        async with self._session.request(
            method, self.server + path, data=data, ssl=self._ssl, headers=self._headers(MERGE_PATCH if data else None)
        ) as response:
            text = await response.text()
            if response.status >= 400:
                try:
                    message = json.loads(text).get("message", text)
                except (ValueError, AttributeError):
                    message = text
                raise KubeError(response.status, str(message)[:500])
            return json.loads(text) if text else None

    @staticmethod
    def _scale_path(namespace: str, deployment: str) -> str:
        return f"/apis/apps/v1/namespaces/{quote(namespace)}/deployments/{quote(deployment)}/scale"

    async def replicas(self, namespace: str, deployment: str) -> int | None:
        """The Deployment's desired replicas, or None when it does not exist."""
        try:
            scale = await self._call("GET", self._scale_path(namespace, deployment))
        except KubeError as error:
            if error.status == 404:
                return None
            raise
        return int(scale.get("spec", {}).get("replicas", 0))

    async def scale(self, namespace: str, deployment: str, replicas: int) -> None:
        await self._call("PATCH", self._scale_path(namespace, deployment), {"spec": {"replicas": replicas}})

    async def report(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}/{quote(name)}/status"
        await self._call("PATCH", path, {"status": status})

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
