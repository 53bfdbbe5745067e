"""The names and wire shapes the components agree on.

Every string that crosses a process boundary (annotation keys, resource names, env vars, host paths, the GPUNode
status) is defined once here, so that the operator, the extender, the node agent, the device plugin and the chart
cannot drift apart. Components import this module; none of them defines its own copy.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field
from pydantic.alias_generators import to_camel

GROUP = "gnnsched.io"
VERSION = "v1alpha1"
API_VERSION: Final = "gnnsched.io/v1alpha1"  # f"{GROUP}/{VERSION}", spelled out so type checkers see the literal
GNNJOB_KIND: Final = "GNNJob"
GNNJOB_PLURAL = "gnnjobs"
GPUNODE_KIND = "GPUNode"
GPUNODE_PLURAL = "gpunodes"
GNNCALIBRATION_KIND = "GNNCalibration"
GNNCALIBRATION_PLURAL = "gnncalibrations"
GNNCALIBRATION_NAME = "default"
"""The one cluster-scoped ``GNNCalibration`` the operator keeps (observed ÷ predicted ratios per calibration class)."""

SCHEDULER_NAME = "gnnsched-scheduler"
GPU_SHARE_RESOURCE = f"{GROUP}/gpu-share"
"""Extended resource: MPS client slots. Each gated process takes one; the agent enforces the per-GPU cap."""

# Pod annotations. Written by the operator:
ANN_JOB = f"{GROUP}/job"  # "<namespace>/<name>" of the owning GNNJob
ANN_ADMIT_BYTES = f"{GROUP}/admit-bytes"  # int: what the gate reserves on one GPU for this pod
ANN_PMC_BYTES = f"{GROUP}/pmc-bytes"  # int: predicted peak memory consumption (before overhead and safety factor)
ANN_PREDICTED_RUNTIME = f"{GROUP}/predicted-runtime-seconds"  # float
PREDICTED_RUNTIME_RESOLUTION_S = 0.001
"""The predicted runtime is kept to the millisecond, and a prediction is never below one millisecond: the extender
takes only a positive runtime in the annotation, and a tiny job's sub-millisecond prediction rounded to ``0.000``
made its pod unschedulable (found by the local cluster's generated small jobs)."""
ANN_INTENSITY = f"{GROUP}/intensity"  # "memory" | "compute": arithmetic-intensity class for interference pairing
ANN_QOS_TARGET = f"{GROUP}/qos-target-seconds"
"""float: an inference GNNJob's ``qosTargetSeconds`` (its latency target), set only on such pods. The gate's share rule
(``node-agent --share-when-pays``, :func:`gnnsched.policies.share_pays`) keeps it: a pod does not join running clients
when that would miss the target while waiting for an idle GPU would meet it. The simulator passes the same target."""
ANN_PRESTART = f"{GROUP}/prestart"
""""true" on a pod whose workload runs behind ``gnnsched gate --prestart`` (the operator's built-in worker with
``--worker-prestart``): its process start-up began when its container started, not when the gate admits it. The node
agent's spread rule reads it to tell how much start-up a client still has ahead of it once admitted
(:func:`gnnsched.policies.startup_left`); it books nothing."""
ANN_ATTEMPT = f"{GROUP}/attempt"  # int, 1-based: which attempt of its GNNJob this pod is (resizes and requeues count)
ANN_EXCLUSIVE = f"{GROUP}/exclusive"
"""``"true"``: the pod runs alone on a whole GPU. The gate admits it only into an empty GPU and admits nothing beside
it; the extender and the simulator count it as holding the GPU's whole capacity. Set by the operator for a job whose
admit bytes exceed a GPU's shareable capacity but whose predicted peak plus overhead fits the whole GPU, and for a
job suspected twice of a fatal MPS fault, or failed with its own fatal error in two faults whose cause could not be
told apart (``undecidedFaults``)."""
ANN_FAULT_PEERS = f"{GROUP}/fault-peers"
"""Comma-separated ``<namespace>/<name>`` of the GNNJobs this attempt may not share a GPU with while it runs: the
other clients of the undecided MPS fault that ended its last attempt
(``gnnsched.attempts.fault_classes.undecided_peers``). Set by the operator on a requeued attempt; the gate refuses a
group or a GPU that would put it beside one of them (``gnnsched.policies.apart_allows``), so the culprit's next fault
names it alone. Read from the GNNJob's ``status.podFacts`` (``gnnsched.trust.job_facts``), never from the pod; it only
ever keeps pods apart. Written and read by ``gnnsched.attempts.fault_classes.format_fault_peers`` and
``parse_fault_peers``."""

ANN_PROBATION_STEP = f"{GROUP}/probation-step"
"""An int: the step at which this attempt's last undecided MPS fault came (``gnnsched.attempts.probation``). The gate
admits the attempt alone where a GPU is idle, and books the whole GPU until its progress reports pass that step: a
culprit's next fault is then its own, alone, and fails it; an innocent client passes the step and shares again. Set
by the operator; read from the GNNJob's ``status.podFacts``, never from the pod."""
ANN_PROBATION_SUSPECT = f"{GROUP}/probation-suspect"
"""``"true"`` beside ``probation-step`` when the probation is a suspect's (its own fault, alone): the gate admits it
alone whether or not a GPU is idle, so it waits for a GPU of its own (``gnnsched.attempts.probation``). Set by the
operator; read from the GNNJob's ``status.podFacts``, never from the pod."""


def gnnjob_owner(meta: object) -> tuple[str, str] | None:
    """``(name, uid)`` of the GNNJob a pod's ``metadata.ownerReferences`` names (kind ``GNNJob`` in this API group),
    or None. Only the reference, which anyone who creates a pod can write: a pod's facts are believed only as
    ``gnnsched.trust.job_facts.resolve`` says (that GNNJob's uid matches and its status names the pod)."""
    refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
    for ref in refs if isinstance(refs, list) else ():
        if (isinstance(ref, dict) and ref.get("kind") == GNNJOB_KIND
                and str(ref.get("apiVersion", "")).split("/")[0] == GROUP):
            return str(ref.get("name", "")), str(ref.get("uid", ""))
    return None


MAX_FAULT_PEERS = 64
"""At most this many peers are written on a pod, read from it and published in its ``GPUNode`` entry: more clients
than that never share one GPU."""
# Written by a user for a pod the operator did not create:
ANN_GPU_MEMORY = f"{GROUP}/gpu-memory"  # Kubernetes quantity of GPU memory the pod needs on one GPU
# Written by the extender at bind:
ANN_RESERVATION = f"{GROUP}/reservation"  # JSON {"node", "gpu", "bytes", "at"}
# Written by the node agent:
ANN_GPU = f"{GROUP}/gpu"  # uuid of the GPU the gate admitted the pod on
ANN_GROUP = f"{GROUP}/group"  # id of the admission group
ANN_ADMITTED_AT = f"{GROUP}/admitted-at"  # RFC 3339
ANN_ADMISSION_SEAL = f"{GROUP}/admission-seal"  # the agent's HMAC over its admission (node_agent.gate_checks)
ANN_STOPPED = f"{GROUP}/stopped"  # JSON: why the node agent stopped the pod's GPU processes (node_agent.overrun)
ANN_STARTED_AT = f"{GROUP}/started-at"
ANN_FINISHED_AT = f"{GROUP}/finished-at"
ANN_OBSERVED_PEAK_BYTES = f"{GROUP}/observed-peak-bytes"  # int: NVML per-process used memory of the pod, sampled max
ANN_FAULT = f"{GROUP}/fault"  # JSON gnnsched.closed_loop.FaultRecord: the pod's GPU had a fatal MPS fault
ANN_ATTEMPT_RESULT = f"{GROUP}/attempt-result"
"""JSON ``gnnsched.closed_loop.AttemptResult`` with ``source: gate``, written by the node agent on a gated pod whose
container failed without a result line of its own (a custom container): ``memory-exceeded`` when its termination
message or log tail shows an out-of-memory error, or when the driver saw its memory at the MPS limit as it died;
``fault`` for a fatal GPU/MPS error. Its ``observed_peak_bytes`` is the agent's sampled peak, ``limit_bytes`` the
admitted bytes."""

# Shortest-predicted-runtime-first queue order (gnnsched.queue_order): PriorityClasses named
# ``<QUEUE_CLASS_PREFIX><bucket, two digits>``, created by the chart, set on pods by the operator.
QUEUE_CLASS_PREFIX = "gnnsched-runtime-"
QUEUE_PRIORITY_BASE = 1000  # value of the longest-runtime bucket; shorter buckets are base + 1, base + 2, ...

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB_NAME = f"{GROUP}/job-name"
MANAGED_BY_VALUE = "gnnsched"

# Environment the operator sets through the downward API and the gate client reads.
ENV_POD_UID = "GNNSCHED_POD_UID"
ENV_POD_NAME = "GNNSCHED_POD_NAME"
ENV_POD_NAMESPACE = "GNNSCHED_POD_NAMESPACE"
ENV_GATE_SOCKET = "GNNSCHED_GATE_SOCKET"
ENV_MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"  # "0=<MiB>M": the per-client limit the gate sets (a bare byte
# count is silently ignored by the driver: measured on an H100, docs/gpu-measurements.md)
ENV_NODE_NAME = "NODE_NAME"
"""The Kubernetes node a node-side process runs on (the chart sets it from the downward API's ``spec.nodeName`` in
the agent, device plugin and MPS daemon containers): the agent's ``--node-name`` default and the seed of fake GPUs'
UUIDs (``gnnsched.gpu.backend.fake_uuid_prefix``)."""
ENV_FAKE_GPU_MEMORY = "GNNSCHED_FAKE_GPU_MEMORY"
"""``enforce`` or ``enforce:FACTOR``: the worker runs on a fake GPU that enforces ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
(``gnnsched.gpu.fake_memory``): it raises PyTorch's CUDA out-of-memory error once its device bytes (live tensor bytes
times FACTOR) would pass the limit. Set only where the GPU is fake: a node agent with ``--gpus fake:...`` hands it to
the
gated workload; tests set it directly."""
ENV_FAKE_GPU_FAULTS = "GNNSCHED_FAKE_GPU_FAULTS"
"""A directory whose files, named after GPU UUIDs and holding an Xid number, are fatal faults on fake GPUs
(``gnnsched.gpu.fake_faults``): the node agent's fake backend reports them as Xid events, and a gated worker on that
GPU fails as an MPS client of a terminated server does. Set only where the GPU is fake (``node-agent --gpus fake:...
--fake-gpu-faults DIR`` hands it to the gated workload)."""
ENV_FAKE_GPU_USAGE = "GNNSCHED_FAKE_GPU_USAGE"
"""A directory where a gated worker on a fake GPU records the device bytes it holds (a file per pid,
``gnnsched.gpu.fake_memory.write_usage``), which the node agent's fake backend lists as NVML lists per-process used
memory. Set only where the GPU is fake (``node-agent --gpus fake:... --fake-gpu-usage DIR``)."""
ENV_ADMITTED_AT = "GNNSCHED_ADMITTED_AT"
"""RFC 3339 time at which the gate admitted the workload to its GPU (set by ``gnnsched gate`` beside
``CUDA_VISIBLE_DEVICES``): a fake GPU's fault written after it terminates the workload
(``gnnsched.gpu.fake_faults``)."""
ENV_GATE_HANDOFF_FD = "GNNSCHED_GATE_HANDOFF_FD"
"""Set by ``gnnsched gate --prestart`` on the workload it starts before admission: the number of an inherited pipe
descriptor on which the gate's keeper writes one ``gnnsched.gate_handoff.Handoff`` line once the node agent has
answered (admitted, with the environment to apply; or rejected). Only the built-in worker reads it."""
ENV_PROGRESS_FD = "GNNSCHED_PROGRESS_FD"
"""Set by ``gnnsched gate`` (plain and ``--prestart``) on the workload: the number of an inherited pipe descriptor on
which the workload may write its progress, one JSON line ``{"steps": N, "total": M, "seconds": S}`` at a time (steps
done of ``total``, in ``S`` seconds since its first step began). The gate's keeper forwards the newest line on the
gate connection at a bounded rate (``node_agent.protocol.ProgressReport``), and the node agent's seconds left for the
pod become its measured pace × steps left (``gnnsched.progress``). The built-in worker writes it
(``gnnsched.progress.StepReporter``); a workload that writes nothing keeps its predicted runtime."""
ENV_PRESTART_FALLBACK = "GNNSCHED_PRESTART_FALLBACK"
"""Set by a prestarted ``gnnsched worker`` on itself when it re-executes as a plain, already-admitted worker: why (its
start-up tried to initialise CUDA before admission, or torch saw no CUDA device once admitted, the driver having
latched "no device" through a path the pre-admission guard does not cover). The re-executed process says so in its log
and in its result line (``AttemptResult.prestart_fallback``); it never falls back again
(``gnnsched.gate_handoff.reexec_admitted``)."""
ENV_CPU_REQUEST = "GNNSCHED_CPU_REQUEST"
"""The container's CPU request in whole CPUs, rounded up (the downward API's ``resourceFieldRef`` ``requests.cpu``
with divisor 1; 0 when the pod requests none). Set by the operator; the worker sizes torch's intra-op thread pool
from it: torch defaults to one thread per core of the *node*, so a job that asked for 2 CPUs on a 64-core node would
run 64 threads and, beside other jobs, the node's cores would be oversubscribed many times over."""
ENV_RESULT_FILE = "GNNSCHED_RESULT_FILE"
"""Set by the operator to the container's termination-message path. The worker is meant to write its final JSON result
line (``gnnsched.closed_loop.AttemptResult``: ``outcome``, ``observed_peak_bytes``, ``seconds``, ``steps``, and for an
out-of-memory attempt ``limit_bytes``, ``held_bytes``, ``requested_bytes``) there, so it reaches the pod status even
when the job succeeds;
``gnnsched worker`` writes it there as well as printing it on stdout."""

# The job pods' container and the settings the operator applies to every job pod (chart values ``jobs.*``).
JOB_CONTAINER_NAME = "gnn"
"""The container that runs ``gnnsched gate -- <workload>`` in a job pod. Its status is read by this name, never by
position: admission webhooks (service meshes, log shippers) may inject containers ahead of it."""
DEFAULT_JOB_RUNTIME_CLASS = "nvidia"
"""RuntimeClass of job pods (the NVIDIA container runtime puts the driver and ``/dev/nvidia*`` into the container)."""
ENV_JOB_RUNTIME_CLASS = "GNNSCHED_JOB_RUNTIME_CLASS"  # operator --runtime-class-name ("" = none)
ENV_JOB_TOLERATIONS = "GNNSCHED_JOB_TOLERATIONS"  # operator --tolerations (JSON list of tolerations)
ENV_JOB_NODE_SELECTOR = "GNNSCHED_JOB_NODE_SELECTOR"  # operator --node-selector (JSON object)
GPU_TAINT_KEY = "nvidia.com/gpu"
"""The taint GPU node pools carry (GKE, EKS and NVIDIA's GPU Operator guides use it); job pods tolerate it by
default."""

# Host paths shared by the node DaemonSet, the device plugin's Allocate mounts and the agent's defaults.
DEFAULT_DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_MPS_PIPE_DIR = "/var/run/gnnsched/mps"
DEFAULT_MPS_LOG_DIR = "/var/log/gnnsched/mps"
DEFAULT_GATE_SOCKET = "/var/run/gnnsched/gate.sock"
DEFAULT_MPS_SHM_DIR = "/var/run/gnnsched/mps-shm"
"""The tmpfs the MPS control daemon's container mounts at ``/dev/shm`` (NVIDIA's ``<mps root>/shm``); the device
plugin's ``Allocate`` mounts the same host directory at ``/dev/shm`` in every gated container, because MPS clients
and the server exchange POSIX shared memory as well as the pipes."""
MPS_SHM_SOURCE = "gnnsched-mps-shm"
"""The mount source (device) name of the tmpfs the chart mounts at the MPS shm directory. A container's private
``/dev/shm`` is a tmpfs too, bind-mounted at its root; the name is what tells the shared one apart in mountinfo."""
CONTAINER_SHM_DIR = "/dev/shm"
DEFAULT_NODE_STATE_DIR = "/var/lib/gnnsched/node-state"
"""Host directory written only by the node agent and the MPS daemon (root, mode 0755) and read by the device plugin:
the agent's status file and the daemon's health file. Never mounted into job pods, unlike the pipe directory, which
every MPS client can write."""
NODE_STATUS_FILE_NAME = "gnnsched-node-status.json"
"""The node agent's ``GPUNodeStatus`` as JSON (``wire()``), rewritten atomically on every publish into the node state
directory (``gnnsched.node_status_file``). The device plugin turns ``mps.healthy``, ``gpus[].mpsHealthy`` and a
stale ``updatedAt`` into Unhealthy slots."""
RETURN_TO_SERVICE_DIR_NAME = "return-to-service"
"""A directory in the node state directory where an admin asks the node agent to put a repaired GPU back into service:
a file named after the GPU's UUID (``gnnsched node-agent return-to-service GPU`` writes it, with a
:class:`ReturnToServiceRequest` inside; an empty file is a request too). A hardware Xid keeps its GPU out of service,
across agent restarts too (the agent keeps the mark in its status file); the running agent reads the request at its
next sample, drops the mark and deletes the file, or refuses it and renames it ``<uuid>.rejected`` with the reason
inside (``gnnsched.return_to_service``; docs/faults.md, "Returning a repaired GPU")."""
RETURN_TO_SERVICE_REJECTED_SUFFIX = ".rejected"
"""A refused return-to-service request is renamed ``<uuid>.rejected``; its text is the agent's reason."""
MPS_DAEMON_HEALTH_FILE_NAME = "mps-daemon.json"
"""``gnnsched mps-daemon``'s health (``MPSDaemonHealth``) in the node state directory; the agent reads it."""
DEFAULT_JOBS_UID = 65532
"""The one Linux UID every gated job process runs as. An MPS control daemon serves one user at a time: a client of a
second UID waits until the first user's server exits, so the gate refuses any other UID."""
ENV_JOBS_UID = "GNNSCHED_JOBS_UID"  # read by the node side and by the operator (--run-as-user: the pods' runAsUser)
OTHER_GPU_RESOURCE = "nvidia.com/gpu"
"""The resource NVIDIA's own device plugin advertises. On a node where gnnsched's plugin runs it means a second plugin
hands out the same GPUs, outside the gate's books; the agent reports it."""

DEFAULT_EXTENDER_PORT = 8888
DEFAULT_AGENT_METRICS_PORT = 9400
DEFAULT_OPERATOR_HEALTH_PORT = 9401
DEFAULT_OPERATOR_METRICS_PORT = 9402

MPS_MAX_CLIENTS_PER_GPU = 48
"""Volta and later accept at most 48 MPS clients per GPU (fewer before Volta)."""


class _CamelModel(BaseModel):
    """Wire models: camelCase on the wire (Kubernetes style), snake_case in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    def wire(self) -> dict:
        """The JSON-ready dict as it is written to the API server."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


class GPUJob(_CamelModel):
    """A pod holding (running) or waiting for (queued) memory on one GPU."""

    pod_uid: str
    namespace: str = ""
    name: str = ""
    job: str | None = None
    bytes: int = Field(ge=0)
    predicted_remaining_seconds: float | None = Field(default=None, ge=0)
    intensity: Literal["memory", "compute"] | None = None
    fault_peers: list[str] = Field(default_factory=list, max_length=MAX_FAULT_PEERS)
    """The jobs this pod may not share a GPU with (its trusted ``gnnsched.io/fault-peers``, as the gate holds them):
    the extender keeps a pod whose job is listed here off this GPU (docs/faults.md)."""


class GPUMeasurement(_CamelModel):
    """A GPU model's device constants as its node measured them (``gnnsched.gpu.measured``): what a job's process
    takes on that GPU beyond its tensors. Published per GPU in ``GPUNode`` status by the node agent, at its start and
    whenever the driver changes; the operator plans that node's GPUs with these values instead of the catalogue's
    (an uncatalogued GPU is planned only with them).

    ``source`` is ``nvml`` for a measurement on the GPU (a probe process's NVML and allocator figures) or ``fake``
    for a fake GPU's stand-in (the same path; values from the agent's ``--fake-gpu-constants``, else the catalogue's
    constants of the fake board's model)."""

    source: Literal["nvml", "fake"]
    measured_at: datetime
    context_bytes: int = Field(ge=0)
    """The CUDA context of one client as MPS charges it at ``active_thread_percentage`` (NVML's used memory of the
    probe minus its allocator's reserved bytes, after the kernels a GNN step loads)."""
    cublas_workspace_bytes: int = Field(ge=0)
    """One cuBLAS workspace (per thread that runs cuBLAS), as the probe's allocator took it at its first matmul."""
    cublaslt_workspace_bytes: int = Field(ge=0)
    """The cuBLASLt workspace taken at the first ``addmm`` with a bias."""
    allocator_matches_model: bool = True
    """The probe's allocator rounded and segmented its test allocations as ``gnnsched.cuda_allocator`` predicts
    (512-byte blocks, 2 MiB / 20 MiB / rounded segments). False, for example, when ``PYTORCH_CUDA_ALLOC_CONF`` turns
    on expandable segments: the reserved-memory model does not hold there."""
    allocator_detail: str = Field(default="", max_length=512)
    active_thread_percentage: int | None = Field(default=None, ge=1, le=100)
    driver_version: str | None = None
    cuda_version: str | None = None
    torch_version: str | None = None
    compute_capability: str | None = None  # "9.0"


class GPUStatus(_CamelModel):
    """One GPU as its node agent sees it; the extender's cache is built from these."""

    index: int = Field(ge=0)
    uuid: str
    model: str
    total_bytes: int = Field(ge=0)
    reserve_bytes: int = Field(default=0, ge=0)
    committed_bytes: int = Field(default=0, ge=0)
    used_bytes: int = Field(default=0, ge=0)
    healthy: bool = True
    mps_healthy: bool = True
    max_clients: int = Field(default=MPS_MAX_CLIENTS_PER_GPU, ge=1)
    draining: bool = False
    """A fatal MPS fault hit this GPU: nothing is admitted until all its clients exited and MPS answers again
    (``mps_healthy`` is false meanwhile). Kept here so a restarted agent keeps draining it."""
    draining_reason: str | None = None  # "Xid", "MpsClientTerminated", "MpsServerFault" or "ClientFault"
    draining_xid: int | None = None
    draining_since: datetime | None = None
    unhealthy_reason: str | None = None
    """Why the driver side calls the GPU unhealthy (``Xid 79``, an NVML error); None while healthy."""
    unhealthy_xid: int | None = None
    """The hardware Xid that took the GPU out of service (docs/faults.md: it stays out until an admin acts)."""
    unhealthy_since: datetime | None = None
    catalogued: bool = True
    """``model`` is a catalogue entry (``gnnsched.gpu.catalogue``). False: NVML's raw name, a GPU the catalogue does
    not know; its jobs run alone (``UnknownGPUModel``) until ``measured`` gives its constants."""
    measured: GPUMeasurement | None = None
    """The node's own measurement of this GPU's device constants (None: not measured yet, or it failed)."""
    returned_to_service_at: datetime | None = None
    """When an admin last returned this GPU to service (the time of the request): a hardware Xid mark from before it
    no longer counts. The device plugin clears its own driver view's mark by it (its NVML saw the same Xid)."""
    running: list[GPUJob] = Field(default_factory=list)
    queued: list[GPUJob] = Field(default_factory=list)

    @property
    def capacity_bytes(self) -> int:
        """What the gate may ever commit on this GPU."""
        return max(0, self.total_bytes - self.reserve_bytes)


class MPSStatus(_CamelModel):
    healthy: bool = True
    restarts: int = Field(default=0, ge=0)
    message: str = ""
    compute_mode: str | None = None  # as the MPS daemon set it ("EXCLUSIVE_PROCESS"); None: not known to the agent
    shm_shared: bool | None = None  # the daemon's /dev/shm is the shared host tmpfs; None: not known to the agent


class MPSDaemonHealth(_CamelModel):
    """What ``gnnsched mps-daemon`` publishes in ``<node state dir>/MPS_DAEMON_HEALTH_FILE_NAME`` on every probe."""

    healthy: bool
    message: str = ""
    restarts: int = Field(default=0, ge=0)
    compute_mode: str = ""  # what the daemon set on every GPU ("EXCLUSIVE_PROCESS", "DEFAULT", "" = left as is)
    gpus: list[str] = Field(default_factory=list)  # UUIDs under this daemon
    pinned_mem_limits: dict[str, str] = Field(default_factory=dict)  # device index -> default limit ("78G")
    jobs_uid: int | None = None  # owner of the pipe and log directories
    shm_shared: bool | None = None  # /dev/shm in the daemon's container is a bind of the shared tmpfs (None: unknown)
    shm_detail: str = ""  # what /proc/self/mountinfo showed for /dev/shm
    pid: int | None = None  # of the ``gnnsched mps-daemon`` process
    updated_at: datetime | None = None


class ReturnToServiceRequest(_CamelModel):
    """The content of a return-to-service request file (``RETURN_TO_SERVICE_DIR_NAME``): who asked, and why. The
    request's time is the file's modification time; an empty file (``touch``) is a request by the file's owner."""

    requested_by: str = Field(default="", max_length=256)
    note: str | None = Field(default=None, max_length=1024)


class NodeCondition(_CamelModel):
    """A Kubernetes-style condition on a ``GPUNode`` (type, status "True"/"False", reason, message)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: datetime | None = None


class LearnedSlowdown(_CamelModel):
    """A co-location slowdown the node agent learned from progress (``gnnsched.colocation.learned``): jobs of class
    ``job_class`` beside co-runners of classes ``beside`` on ``gpu_model`` ran ``slowdown`` times slower than alone,
    where the interference model predicts ``prior``; ``samples`` observations (the rule acts from 3)."""

    gpu_model: str = Field(max_length=128)
    job_class: str = Field(max_length=32)
    beside: list[str] = Field(max_length=48)
    slowdown: float = Field(gt=0)
    prior: float = Field(gt=0)
    samples: int = Field(ge=0)
    calibrated: bool


MAX_LEARNED_SLOWDOWNS = 64
"""At most this many learned slowdowns in a GPUNode's status (the most observed first): one status stays small
whatever mix of classes a node has seen."""


class GPUNodeStatus(_CamelModel):
    """The status of a cluster-scoped ``GPUNode`` object, written only by the node's agent."""

    node_name: str
    updated_at: datetime | None = None
    mps: MPSStatus = Field(default_factory=MPSStatus)
    gpus: list[GPUStatus] = Field(default_factory=list)
    conditions: list[NodeCondition] = Field(default_factory=list)
    learned_slowdowns: list[LearnedSlowdown] = Field(default_factory=list, max_length=MAX_LEARNED_SLOWDOWNS)

    @computed_field(alias="gpuCount")  # type: ignore[prop-decorator]
    @property
    def gpu_count(self) -> int:
        """Written for the ``kubectl get gpunodes`` column; derived, so it cannot disagree with ``gpus``."""
        return len(self.gpus)

    @computed_field(alias="unhealthyGpus")  # type: ignore[prop-decorator]
    @property
    def unhealthy_gpus(self) -> int:
        """GPUs out of service (``healthy: false``), for the ``kubectl get gpunodes`` column; derived like
        ``gpuCount``."""
        return sum(1 for g in self.gpus if not g.healthy)
