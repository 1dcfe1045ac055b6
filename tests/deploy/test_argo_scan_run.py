"""deploy/argo/execwatch-scan-run.yaml: the pre-promotion `execwatch scan --run` analysis.

The real Argo Rollouts controller (dev/k8s-tools.sh) runs against the real kube-apiserver
of tests/kube, with the template and the Rollout of deploy/argo/rollout-example.yaml
applied as written (namespace, replicas 0 and the image adapted; its background analyses,
which need Prometheus, left out: tests/deploy/test_argo.py and tests/node prove those).
A new image makes the controller run the canary's first step: it resolves the image from
the Rollout, creates the AnalysisRun and the Job, and the API server admits the Job's pod
template (user namespace, unmasked /proc) as Kubernetes 1.35 validates it.

The Job's container then runs for real: the execwatch image (dev/images.sh) in a private
dockerd, with the container's args and env as the controller wrote them and the pod's
settings as Docker spells them (seccomp unconfined, systempaths unconfined for the
unmasked /proc, every capability dropped, no-new-privileges, the user, a read-only root, the
emptyDir and the registry Secret as directories), against images pushed to the test
registry, pulled with the Secret's credentials: a static program passes, a glibc program on
a musl base fails. Docker has no per-container user namespace here (hostUsers: false is not
reproduced), the test registry's CA is given through REQUESTS_CA_BUNDLE and the network
is the host's.

Stood in for: there is no job controller or kubelet here, so the container's exit code is
written into the Job's status by the test, as the job controller would write it; the
controller's reading of it (analysis Successful or Failed, rollout going on or aborted) is
real.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.support.binfmt.cbuild import HELLO_C, compile_c
from tests.support.deploy.chart import REPO
from tests.support.engines.dockerd import Dockerd
from tests.support.images.base_images import musl_base
from tests.support.images.imagebuild import Image, file, oci_layout
from tests.support.kube.apiserver import ADMIN_TOKEN, KubeCluster, Proc, apply, ensure_namespace
from tests.support.kube.rollouts_controller import rollouts_controller as start_controller
from tests.support.kubenode.node_images import (
    MUSL_LOADER,
    execwatch_image,
    require_execwatch_archive,
)
from tests.support.registry.registry_fixtures import registry
from tests.support.registry.registry_server import Registry
from tests.support.wait import wait_until

ARGO = REPO / "deploy" / "argo"
TEMPLATE = ARGO / "execwatch-scan-run.yaml"
NS = "scan-run"
GROUP, VERSION = "argoproj.io", "v1alpha1"
V1 = "registry.example:5000/shop/oberon-runner:v1"

__all__ = ["registry"]  # the session's test registry, a fixture


def template() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(TEMPLATE.read_text())
    return doc


def pod_spec(tmpl: dict[str, Any]) -> dict[str, Any]:
    (metric,) = tmpl["spec"]["metrics"]
    spec: dict[str, Any] = metric["provider"]["job"]["spec"]["template"]["spec"]
    return spec


def test_the_template_declares_every_arg_it_uses_and_defaults_to_the_charts_image() -> None:
    tmpl = template()
    declared = {a["name"]: a.get("value") for a in tmpl["spec"]["args"]}
    used = set(re.findall(r"\{\{\s*args\.([\w-]+)\s*\}\}", yaml.safe_dump(tmpl["spec"])))
    assert used == set(declared)
    assert declared["image"] is None, "the image is the one thing a Rollout must pass"
    assert declared["execwatch-image"] == execwatch_image()
    (metric,) = tmpl["spec"]["metrics"]
    assert metric["failureLimit"] == 0
    assert metric["provider"]["job"]["spec"]["backoffLimit"] == 0


def test_the_jobs_pod_gets_what_the_sandbox_needs_and_no_privilege() -> None:
    spec = pod_spec(template())
    (ctr,) = spec["containers"]
    sc, pod_sc = ctr["securityContext"], spec["securityContext"]
    assert spec["hostUsers"] is False and sc["procMount"] == "Unmasked"
    assert pod_sc["seccompProfile"] == {"type": "Unconfined"}
    assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
    assert sc["capabilities"] == {"drop": ["ALL"]} and "add" not in sc["capabilities"]
    assert sc["allowPrivilegeEscalation"] is False and "privileged" not in sc
    assert sc["readOnlyRootFilesystem"] is True
    assert not spec.get("hostPID") and not spec.get("hostNetwork")
    assert spec["automountServiceAccountToken"] is False


# -- the real controller -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def rollouts_controller(kube: KubeCluster) -> Iterator[Proc]:
    kubeconfig = kube.kubeconfig(ADMIN_TOKEN, kube.workdir / "rollouts.kubeconfig")
    with kube.client() as api, start_controller(api, kubeconfig, kube.workdir) as proc:
        yield proc


def rollout_from_example(name: str) -> dict[str, Any]:
    """deploy/argo/rollout-example.yaml as its comment says to adapt it."""
    (doc,) = [d for d in yaml.safe_load_all((ARGO / "rollout-example.yaml").read_text()) if d]
    rollout: dict[str, Any] = copy.deepcopy(doc)
    rollout["metadata"].update(name=name, namespace=NS)
    rollout["spec"]["replicas"] = 0
    rollout["spec"]["selector"]["matchLabels"]["app"] = name
    rollout["spec"]["template"]["metadata"]["labels"]["app"] = name
    rollout["spec"]["template"]["spec"]["containers"][0]["image"] = V1
    del rollout["spec"]["strategy"]["canary"]["analysis"]
    return rollout


class Rollouts:
    def __init__(self, api: client.ApiClient, controller: Proc) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.batch = client.BatchV1Api(api)
        self.controller = controller

    def get(self, plural: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, NS, plural, name
        )
        return obj

    def wait(self, what: str, check: Any, timeout: float = 60) -> Any:
        def explain() -> str:
            return f"waiting for {what}; the controller's log:\n{self.controller.tail()}"

        return wait_until(check, timeout=timeout, step=0.5, explain=explain)

    def set_image(self, name: str, image: str) -> None:
        patch = {"spec": {"template": {"spec": {"containers": [{"name": "oberon-runner",
                                                                 "image": image}]}}}}  # fmt: skip
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, "rollouts", name, patch)

    def analysis_job(self, rollout: str) -> tuple[dict[str, Any], client.V1Job]:
        """The step's AnalysisRun and the Job the controller made for it."""

        def found() -> tuple[dict[str, Any], client.V1Job] | None:
            runs = self.custom.list_namespaced_custom_object(GROUP, VERSION, NS, "analysisruns")
            for run in runs["items"]:
                owners = [o["name"] for o in run["metadata"].get("ownerReferences", [])]
                if rollout not in owners:
                    continue
                for job in self.batch.list_namespaced_job(NS).items:
                    if any(o.uid == run["metadata"]["uid"] for o in job.metadata.owner_references):
                        return run, job
            return None

        result: tuple[dict[str, Any], client.V1Job] = self.wait("the analysis Job", found)
        return result

    def finish(self, job: client.V1Job, succeeded: bool) -> None:
        """What the job controller writes when the pod exits 0 (or not)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        reached = ("SuccessCriteriaMet", "Complete") if succeeded else ("FailureTarget", "Failed")
        status: dict[str, Any] = {
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": now, "lastTransitionTime": now,
                 "reason": "CompletionsReached" if succeeded else "BackoffLimitExceeded",
                 "message": "Reached expected number of succeeded pods" if succeeded
                 else "Job has reached the specified backoff limit"}
                for t in reached
            ],
        }  # fmt: skip
        if succeeded:
            status.update(succeeded=1, completionTime=now)
        else:
            status["failed"] = 1
        self.batch.patch_namespaced_job_status(job.metadata.name, NS, {"status": status})


@pytest.fixture
def rollouts(kube: KubeCluster, rollouts_controller: Proc) -> Iterator[Rollouts]:
    with kube.client() as api:
        ensure_namespace(api, NS)
        tmpl = template()
        tmpl["metadata"]["namespace"] = NS
        apply(api, [tmpl])
        yield Rollouts(api, rollouts_controller)


def start_canary(rollouts: Rollouts, name: str, image: str) -> tuple[dict[str, Any], Any]:
    with_v1 = rollout_from_example(name)
    rollouts.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "rollouts", with_v1)
    rollouts.wait(
        "v1 Healthy",
        lambda: rollouts.get("rollouts", name).get("status", {}).get("phase") == "Healthy",
    )
    rollouts.set_image(name, image)
    return rollouts.analysis_job(name)


def job_container(job: client.V1Job) -> client.V1Container:
    (ctr,) = job.spec.template.spec.containers
    result: client.V1Container = ctr
    return result


@pytest.fixture(scope="module")
def dockerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dockerd]:
    """A private dockerd holding the execwatch image, the Job's container runtime here."""
    try:
        archive = require_execwatch_archive()
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    daemon = Dockerd(tmp_path_factory.mktemp("scan-run-dockerd"))
    daemon.start()
    try:
        daemon.docker("load", "-q", "-i", str(archive))
        yield daemon
    finally:
        daemon.stop()


def push_image(registry: Registry, work: Path, honest: bool) -> str:
    """An honest image (a static program) or a broken one (a glibc program on a musl base)."""
    work.mkdir(parents=True, exist_ok=True)
    if honest:
        app = compile_c(work / "app", HELLO_C, "musl-gcc", "-static")
        layers = [[file("app", app.read_bytes())]]
    else:
        app = compile_c(work / "app", HELLO_C, "gcc")
        layers = [musl_base(MUSL_LOADER.read_bytes()), [file("app", app.read_bytes())]]
    layout = oci_layout(work / "layout", [Image(layers, entrypoint=["/app"])])
    tag = "v2-honest" if honest else "v2-broken"
    return registry.push(layout, f"shop/oberon-runner:{tag}")


def run_job_container(
    dockerd: Dockerd, job: client.V1Job, registry: Registry, work: Path
) -> subprocess.CompletedProcess[str]:
    """The Job's container, its pod's settings as Docker spells them."""
    pod = job.spec.template.spec
    (ctr,) = pod.containers
    sc, pod_sc = ctr.security_context, pod.security_context
    argv = ["run", "--rm", "--network", "host", "--cap-drop", "ALL"]
    assert sc.capabilities.drop == ["ALL"] and not sc.capabilities.add
    argv += ["--user", f"{pod_sc.run_as_user}:{pod_sc.run_as_group}"]
    if sc.allow_privilege_escalation is False:
        argv += ["--security-opt", "no-new-privileges"]
    if pod_sc.seccomp_profile.type == "Unconfined":
        argv += ["--security-opt", "seccomp=unconfined"]
    if sc.proc_mount == "Unmasked":
        argv += ["--security-opt", "systempaths=unconfined"]
    if sc.read_only_root_filesystem:
        argv.append("--read-only")
    for env in ctr.env:
        argv += ["-e", f"{env.name}={env.value}"]
    work.mkdir(parents=True)
    (work / "ca.crt").write_bytes(registry.ca.read_bytes())
    argv += ["-e", "REQUESTS_CA_BUNDLE=/etc/test-registry-ca.crt"]
    argv += ["-v", f"{work / 'ca.crt'}:/etc/test-registry-ca.crt:ro"]
    volumes = {v.name: v for v in pod.volumes}
    for mount in ctr.volume_mounts:
        host = work / "volumes" / mount.name
        host.mkdir(parents=True)
        volume = volumes[mount.name]
        if volume.secret is not None:  # the dockerconfigjson Secret, its key as the item's path
            (item,) = volume.secret.items
            auths = json.loads(registry.auth_file(work / "auth.json").read_text())
            (host / item.path).write_text(json.dumps(auths))
            (host / item.path).chmod(0o644)
        host.chmod(0o1777 if volume.empty_dir is not None else 0o755)
        argv += ["-v", f"{host}:{mount.mount_path}" + (":ro" if mount.read_only else "")]
    argv += [ctr.image, *ctr.args]
    return subprocess.run(
        ["docker", *argv], env=dockerd.env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("honest", [True, False], ids=["honest", "broken"])
def test_a_new_image_is_scanned_by_a_job_before_the_canary_gets_traffic(
    rollouts: Rollouts, dockerd: Dockerd, registry: Registry, tmp_path: Path, honest: bool
) -> None:
    name = f"oberon-{'honest' if honest else 'broken'}"
    image = push_image(registry, tmp_path / "image", honest)
    run, job = start_canary(rollouts, name, image)

    ctr = job_container(job)
    assert ctr.image == execwatch_image()
    assert ctr.args == ["scan", image, "--run", "--run-args=--version", "--no-progress",
                        "--cache-size=0"]  # fmt: skip
    pod = job.spec.template.spec
    assert pod.host_users is False and ctr.security_context.proc_mount == "Unmasked"
    assert job.spec.backoff_limit == 0
    assert rollouts.get("rollouts", name)["status"].get("currentStepIndex", 0) == 0

    scan = run_job_container(dockerd, job, registry, tmp_path / "job")
    assert scan.returncode == (0 if honest else 1), scan.stdout + scan.stderr
    if honest:
        assert "run: started: exit 0" in scan.stdout
    else:
        assert "missing-interpreter" in scan.stdout and "run: " in scan.stdout

    rollouts.finish(job, succeeded=scan.returncode == 0)
    phase = "Successful" if honest else "Failed"
    rollouts.wait(
        f"AnalysisRun {phase}",
        lambda: (
            rollouts.get("analysisruns", run["metadata"]["name"]).get("status", {}).get("phase")
            == phase
        ),
    )
    if honest:
        rollouts.wait(
            "the canary's next step",
            lambda: rollouts.get("rollouts", name)["status"].get("currentStepIndex", 0) >= 1,
        )
        assert not rollouts.get("rollouts", name)["status"].get("abort")
    else:
        aborted = rollouts.wait(
            "the rollout aborted",
            lambda: (r := rollouts.get("rollouts", name))["status"].get("abort") and r,
        )
        assert aborted["status"]["phase"] == "Degraded"
        assert aborted["status"].get("currentStepIndex", 0) == 0
