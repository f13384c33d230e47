"""Which Ray cluster the Ray engine runs on, and that a cluster it starts stays on this machine's loopback.

A build or audit on Ray joins only the cluster the user names (``--address``, else ``RAY_ADDRESS``), checked to
answer before Ray is asked to join it; without one it starts its own, on loopback, never the cluster another
process left running. The sockets are those of the processes a test started (the test's own cluster: this
process's children; a build: the CLI's process tree, sampled while it runs), never every process on the machine:
another Ray cluster or a vLLM server may run beside the suite.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from corpus_builder.ray_extra import RAY_ENVIRONMENT
from tests.support.ray_cluster import Socket, imported_ray, local_cluster, process_tree, role, sockets
from tests.support.real_data import write_chitchat

ray = imported_ray()
RAY_PACKAGE = str(Path(ray.__file__).parent)

HOW_TO_NAME = "a Ray head's address is HOST:PORT, as `ray start --head` prints it (port 6379 by default)"


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """The test's cluster, started as the Ray engine starts its own; its address."""
    with local_cluster() as address:
        yield address


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray-cluster")
    write_chitchat(root / "chitchat.jsonl", 60)
    path = root / "recipe.yaml"
    path.write_text("name: ray-cluster\ntarget: {model: tiny/target}\n"
                    "sources:\n  - {name: chitchat, kind: replay, path: chitchat.jsonl}\n"
                    "split: {validation_fraction: 0.2, seed: 3}\noutput: {dir: out}\n", encoding="utf-8")
    return path


def environment(**changes: str | None) -> dict[str, str]:
    """This process's environment with ``changes`` (None: removed), without RAY_ADDRESS and without what the Ray
    engine sets before it imports Ray (this process has it: the CLI must set it itself)."""
    env = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS" and name not in RAY_ENVIRONMENT}
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def corpus_cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI, bounded: a command that would wait on a cluster for minutes fails the test instead."""
    return subprocess.run([sys.executable, "-m", "corpus_builder", *map(str, args)], capture_output=True, text=True,
                          env=env if env is not None else environment(), timeout=180, check=False)


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What the CLI says of a usage error (exit 2, no traceback; Ray may log its own lines around it)."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("error: ")]


def runs_ray(process: psutil.Process) -> bool:
    """Whether a process runs Ray's code: a worker (``ray::...``) or one of Ray's own programs and scripts."""
    with contextlib.suppress(psutil.Error):
        return process.name().startswith("ray::") or any(
            argument.startswith(RAY_PACKAGE) for argument in process.cmdline())
    return False


def listening(found: set[Socket], process: str) -> list[Socket]:
    return [found_socket for found_socket in found if found_socket.process == process and not found_socket.remote]


def test_the_tests_cluster_listens_on_loopback_alone(cluster: str) -> None:
    """Every process of the cluster (this process, the driver; the GCS, the raylet, the agents, the workers: the
    children that run Ray's code, not a server another module's fixture left running) listens on 127.0.0.0/8 alone
    and is connected to nothing outside; no dashboard listens."""
    driver, *children = process_tree(os.getpid())
    tree = [driver, *(child for child in children if runs_ray(child))]
    found = sockets(tree)
    port = cluster.rpartition(":")[2]
    # the fixture exercises what it means to: the GCS on the cluster's address, the raylet and the workers
    assert [gcs.local.rpartition(":")[2] for gcs in listening(found, "gcs_server")] == [port]
    assert listening(found, "raylet") and listening(found, "ray::IDLE")
    assert sorted(found_socket for found_socket in found if found_socket.outside) == []
    assert not listening(found, "dashboard.py")
    # usage statistics off where Ray would report them (the dashboard's head process, headless here) and in the
    # processes the driver starts (those the raylet starts rewrite their environment's memory with their title)
    started = {role(process): process.environ().get("RAY_USAGE_STATS_ENABLED") for process in tree[1:]}
    assert {started[name] for name in ("dashboard.py", "gcs_server", "raylet")} == {"0"}


def build_watched(recipe: Path, out: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str],
                                                                          set[Socket], set[str]]:
    """``corpus build RECIPE --engine ray`` with ``env``, its process tree's sockets sampled while it runs (every
    Ray process it starts lives for seconds), and the roles of the processes it started, all gone after it ends."""
    logs = out.parent / f"{out.name}.log"
    found: set[Socket] = set()
    started: dict[int, tuple[psutil.Process, str]] = {}
    with logs.open("w") as log:
        build = subprocess.Popen([sys.executable, "-m", "corpus_builder", "build", str(recipe), "--out", str(out),
                                  "--engine", "ray"], stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            while build.poll() is None:
                tree = process_tree(build.pid)
                for process in tree[1:]:
                    with contextlib.suppress(psutil.Error):  # its latest role: a child is python until it executes
                        started[process.pid] = process, role(process)
                found |= sockets(tree)
                time.sleep(0.2)
        finally:
            if build.poll() is None:
                build.kill()
            build.wait()
    _, alive = psutil.wait_procs([process for process, _ in started.values()], timeout=60)
    for process in alive:  # a test's leftovers are its own to stop; the assertion below fails the test
        process.kill()
    assert not alive, f"processes the build started are alive after it: {alive}"
    return (subprocess.CompletedProcess(build.args, build.returncode, logs.read_text(), ""), found,
            {name for _, name in started.values()})


def test_a_ray_build_without_an_address_starts_its_own_cluster_on_loopback(cluster: str, recipe: Path,
                                                                           tmp_path: Path) -> None:
    """The test's cluster recorded as the one a `ray start` left running on the machine (the file Ray's own default
    joins): the build does not join it, it starts a cluster of its own (a GCS among its processes), every
    process of which listens on loopback alone and connects to nothing outside, without a dashboard; it stops
    them when it ends."""
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    try:
        (ray_tmp / "ray").mkdir()
        (ray_tmp / "ray" / "ray_current_cluster").write_text(cluster)
        done, found, roles = build_watched(recipe, tmp_path / "out", environment(RAY_TMPDIR=str(ray_tmp)))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stdout
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert len(listening(found, "gcs_server")) == 1 and listening(found, "raylet")
    assert sorted(found_socket for found_socket in found if found_socket.outside) == []
    assert not listening(found, "dashboard.py")
    assert {"gcs_server", "raylet"} <= roles


def test_a_ray_build_joins_the_cluster_ray_address_names(cluster: str, recipe: Path, tmp_path: Path) -> None:
    """Named by RAY_ADDRESS (the loopback address the test's cluster listens on, not rewritten to the machine's
    network one): joined, no cluster of its own started, the driver on loopback too."""
    done, found, roles = build_watched(recipe, tmp_path / "out", environment(RAY_ADDRESS=cluster))
    assert done.returncode == 0, done.stdout
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert not roles & {"gcs_server", "raylet"}
    port = cluster.rpartition(":")[2]
    assert any(found_socket.remote.rpartition(":")[2] == port for found_socket in found)  # the driver's, to the GCS
    assert sorted(found_socket for found_socket in found if found_socket.outside) == []


@pytest.mark.parametrize("address", ["auto:port", "head", "10.0.0.1:99999", "10.0.0.1:0", "[::1]x:6379", ":6379",
                                     "ray://10.0.0.1:10001"])
def test_an_address_that_is_not_one_is_a_usage_error(recipe: Path, address: str, tmp_path: Path) -> None:
    """Refused before anything is read or written, named by where it came from: --address, or RAY_ADDRESS."""
    out = tmp_path / "out"
    for named_by, arguments, env in (("--address", ("--address", address), environment()),
                                     ("RAY_ADDRESS", (), environment(RAY_ADDRESS=address))):
        [error] = error_lines(corpus_cli("build", recipe, "--out", out, "--engine", "ray", *arguments, env=env))
        if address.startswith("ray://"):
            assert error == (f"error: {named_by} {address}: the Ray engine joins a cluster by its head's address, "
                             f"not a URL (Ray Client's ray:// is not supported): {HOW_TO_NAME}")
        else:
            assert error == f"error: {named_by} {address}: not a Ray cluster's address: {HOW_TO_NAME}"
        assert not out.exists()


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, never listening, for the test's time: no one else takes it)."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


@pytest.fixture
def web_port() -> Iterator[int]:
    """A loopback port where an HTTP/1.1 server answers (as a dashboard's port does): not a Ray head."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_an_address_where_no_ray_head_answers_fails_at_once(recipe: Path, closed_port: int, web_port: int,
                                                            tmp_path: Path) -> None:
    """Ray itself retries such an address for minutes; the engine probes it first and says what it found."""
    out = tmp_path / "out"
    [refused] = error_lines(corpus_cli("build", recipe, "--out", out, "--engine", "ray", "--address",
                                       f"127.0.0.1:{closed_port}"))
    assert refused == (f"error: --address 127.0.0.1:{closed_port}: no Ray cluster there (nothing listens on port "
                       f"{closed_port} of 127.0.0.1): {HOW_TO_NAME}")
    [web] = error_lines(corpus_cli("build", recipe, "--out", out, "--engine", "ray",
                                   env=environment(RAY_ADDRESS=f"localhost:{web_port}")))
    assert web == (f"error: RAY_ADDRESS localhost:{web_port}: something listens there, but it is not a Ray "
                   "cluster's head (it does not answer as gRPC does; the dashboard's port is not the head's): "
                   f"{HOW_TO_NAME}")
    [unknown] = error_lines(corpus_cli("build", recipe, "--out", out, "--engine", "ray", "--address",
                                       "no-such-host.invalid:6379"))
    assert unknown == "error: --address no-such-host.invalid:6379: cannot resolve the host no-such-host.invalid"
    assert not out.exists()


def test_the_dry_run_says_which_cluster_the_build_would_run_on(cluster: str, recipe: Path, closed_port: int,
                                                               tmp_path: Path) -> None:
    """Started here, or the named cluster's head probed (not joined); a head that does not answer, or an address
    that is none, is a problem of the plan (exit 2); --address without the Ray engine a usage error."""
    dry = ("build", recipe, "--out", tmp_path / "out", "--dry-run")
    own = corpus_cli(*dry, "--engine", "ray")
    assert own.returncode == 0, own.stderr
    assert ("\nengine: ray, on a cluster the build starts on this machine (loopback alone, no dashboard, no usage "
            "statistics) and stops when it ends\n") in own.stdout
    named = corpus_cli(*dry, "--engine", "ray", env=environment(RAY_ADDRESS=cluster))
    assert named.returncode == 0, named.stderr
    assert (f"\nengine: ray, on the cluster at {cluster} (RAY_ADDRESS): its head answers (probed, not joined: the "
            "dry run runs nothing on it)\n") in named.stdout
    down = corpus_cli(*dry, "--engine", "ray", "--address", f"127.0.0.1:{closed_port}")
    assert down.returncode == 2
    assert f"\nengine: ray, on the cluster at 127.0.0.1:{closed_port} (--address): does not answer\n" in down.stdout
    assert down.stdout.endswith(f"\nproblems:\n  --address 127.0.0.1:{closed_port}: no Ray cluster there (nothing "
                                f"listens on port {closed_port} of 127.0.0.1): {HOW_TO_NAME}\n")
    malformed = corpus_cli(*dry, "--engine", "ray", "--address", "head")
    assert malformed.returncode == 2
    assert malformed.stdout.endswith(f"\nproblems:\n  --address head: not a Ray cluster's address: {HOW_TO_NAME}\n")
    [error] = error_lines(corpus_cli(*dry, "--address", cluster))
    assert error == "error: --address names a Ray cluster: it needs --engine ray (or engine: ray in the recipe)"
    assert not (tmp_path / "out").exists()


def test_a_cluster_is_not_started_where_ray_would_give_it_the_network_address() -> None:
    """Ray imported before the engine set its environment (a program that imports Ray itself first): the engine
    refuses to start a cluster Ray would put on the machine's network address, and starts nothing."""
    script = ("import ray\n"
              "print(ray.util.get_node_ip_address())\n"
              "from corpus_builder.ray_cluster import start_cluster\n"
              "from corpus_builder.errors import CorpusError\n"
              "try:\n    start_cluster()\nexcept CorpusError as error:\n    print(error)\n"
              "print(ray.is_initialized())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120,
                          env=environment())
    node, refusal, initialized = done.stdout.splitlines()
    if node.startswith("127."):
        pytest.skip("this machine has no network address for Ray to take")
    assert refusal == (f"a Ray cluster started here would listen on {node}, not on loopback alone: Ray was imported "
                       "before the Ray engine set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0; set "
                       "them in the environment, or start a cluster yourself and name it with --address")
    assert initialized == "False"
