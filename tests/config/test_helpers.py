"""Helpers the server uses: certificate mappings, TLS file checks, small value types."""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path

import pytest
from cronoq.config import (
    AuthConfig,
    CertSpec,
    Config,
    ConfigError,
    PeerTlsConfig,
    PoolSection,
    Role,
    SemaphoreResource,
    ServerConfig,
    TenantWeights,
    TlsConfig,
    TokenBucketResource,
    TokenSpec,
    is_loopback_host,
    parse_label,
)

from .helpers import assert_loads


def test_cert_mapping_by_dns_name_ignores_case_and_trailing_dot() -> None:
    worker = CertSpec("Worker-1.Internal", Role.WORKER, pools=("gpu",), labels=(("gpu", "a100"),))
    metrics = CertSpec("dash.internal", Role.METRICS)
    auth = AuthConfig(certs=(worker, metrics))
    assert auth.enabled
    assert auth.cert_for(["other.internal", "worker-1.internal."]) is worker
    assert auth.cert_for(["DASH.internal"]) is metrics
    assert auth.cert_for(["nobody.internal"]) is None
    assert worker.allows_pool("gpu") and not worker.allows_pool("cpu")
    assert worker.allows_labels({"gpu": "a100"}) and not worker.allows_labels({"gpu": "a100", "zone": "eu"})
    assert metrics.allows_pool("anything") and metrics.allows_labels({"x": "y"})


def test_file_errors_name_unreadable_tls_files(tmp_path: Path) -> None:
    cert = tmp_path / "server.pem"
    cert.write_text("pem", encoding="utf-8")
    config = Config(
        server=ServerConfig(
            tls=TlsConfig(cert=str(cert), key=str(tmp_path / "missing.key"), client_ca=str(tmp_path)),
            peer_tls=PeerTlsConfig(ca=str(cert)),
        )
    )
    errors = config.file_errors()
    assert [error.split(":")[0] for error in errors] == ["server.tls.key", "server.tls.client_ca"]
    assert str(tmp_path / "missing.key") in errors[0]
    assert Config.default().file_errors() == []


NOBODY = 65534


def _file_errors_as_unprivileged(config: Config) -> list[str]:
    """``config.file_errors()`` computed in a forked child that, when run as root, first drops to
    the ``nobody`` user (root reads every file whatever its mode)."""
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe and exits
        status = 0
        try:
            os.close(reader)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            os.write(writer, json.dumps(config.file_errors()).encode())
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        answer = pipe.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, answer
    errors: list[str] = json.loads(answer)
    return errors


def test_file_errors_report_unreadable_files() -> None:
    # Not under pytest's tmp_path: its folders are private to the test's user, and the child must
    # see the file exists before finding it unreadable.
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o755)
        key = Path(folder) / "server.key"
        key.write_text("secret", encoding="utf-8")
        key.chmod(0)
        config = Config(server=ServerConfig(tls=TlsConfig(cert=str(key), key=str(key))))
        errors = _file_errors_as_unprivileged(config)
    assert errors == [f"server.tls.cert: {key} is not readable", f"server.tls.key: {key} is not readable"]


def test_tenant_weights_are_immutable_hashable_and_picklable() -> None:
    weights = TenantWeights({"acme": 3.0})
    assert weights == {"acme": 3.0} and len(weights) == 1 and list(weights) == ["acme"]
    assert weights.weight("acme") == 3.0 and weights.weight("other") == 1.0 and weights.weight(None) == 1.0
    assert hash(weights) == hash(TenantWeights({"acme": 3.0}))
    assert pickle.loads(pickle.dumps(weights)) == weights
    assert not hasattr(weights, "__setitem__")
    pool = PoolSection("p", tenant_weights=weights)
    assert pool.fair and hash(pool) == hash(PoolSection("p", tenant_weights=TenantWeights({"acme": 3.0})))


def test_loaded_config_pickles_and_hashes() -> None:
    config = assert_loads('[[pools]]\nname = "p"\ntenant_weights = { a = 2 }\n')
    assert pickle.loads(pickle.dumps(config)) == config
    assert hash(config) == hash(Config.parse(config.to_toml(), env={}))


def test_resource_capacity() -> None:
    assert SemaphoreResource("s", permits=3).capacity == 3
    assert TokenBucketResource("t", rate=1.0, burst=7).capacity == 7


def test_pool_bounds_fall_back_to_limits() -> None:
    config = Config.parse("[limits]\nmax_pending_per_pool = 9\nmax_slots_per_worker = 4\n", env={})
    pool = config.pools[0]
    assert pool.pending_bound(config.limits) == 9
    assert pool.slots_cap(config.limits) == 4
    own = PoolSection("p", max=100, max_pending=3, max_slots_per_worker=50)
    assert own.pending_bound(config.limits) == 3 and own.slots_cap(config.limits) == 50


def test_labels_and_names_with_nul_are_refused() -> None:
    with pytest.raises(ValueError):
        parse_label("a=\0")
    config = Config(
        auth=AuthConfig(tokens=(TokenSpec.from_token("t" * 40, Role.WORKER, labels=[("", "x")], tenant="a\0b"),))
    )
    errors = config.validate()
    assert any(e.startswith("auth.tokens[0].labels[0]: ") for e in errors)
    assert any(e.startswith("auth.tokens[0].tenant: ") and "NUL" in e for e in errors)


def test_non_utf8_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"# caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        Config.load(path, env={})
    assert "not UTF-8" in info.value.errors[0]


def test_loopback_hosts() -> None:
    for host in ("localhost", "LOCALHOST", "app.localhost", "127.0.0.1", "127.8.9.10", "::1", "[::1]"):
        assert is_loopback_host(host), host
    for host in ("0.0.0.0", "::", "10.0.0.1", "example.com", "localhost.example.com", "[::]"):
        assert not is_loopback_host(host), host
