"""The Pod Security Standards' ``restricted`` profile as checks over a pod manifest (test infrastructure).

Written from the control tables of https://kubernetes.io/docs/concepts/security/pod-security-standards/ (Baseline
controls, which Restricted includes, then the Restricted ones), for the latest policy version. Each check returns
the violations it finds as ``"<control>: <field path> <problem>"`` lines, the way the PodSecurity admission plugin
words its ``violates PodSecurity "restricted:latest"`` refusal, so a failing test names the control it broke.

Fields the standard reads at pod level and per container ("containers, initContainers, ephemeralContainers") are
checked for all three container lists.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Baseline "Capabilities": what may be added beyond the runtime's default set.
BASELINE_ADDABLE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP",
    "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
})
# Baseline "Sysctls": the safe set.
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
})
# Baseline "SELinux": allowed types (user and role must be unset).
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
# Restricted "Volume Types": the only volume sources allowed.
RESTRICTED_VOLUME_SOURCES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
})
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for field in CONTAINER_LISTS:
        for i, container in enumerate(spec.get(field) or []):
            yield f"spec.{field}[{i}]", container


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Every ``restricted`` control the pod breaks (empty: the PodSecurity admission plugin would admit it)."""
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    psc = spec.get("securityContext") or {}
    out: list[str] = []
    containers = list(_containers(spec))

    # --- Baseline controls ---
    # HostProcess
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("HostProcess: spec.securityContext.windowsOptions.hostProcess must be unset or false")
    for path, c in containers:
        if ((c.get("securityContext") or {}).get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"HostProcess: {path}.securityContext.windowsOptions.hostProcess must be unset or false")
    # Host Namespaces
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            out.append(f"Host Namespaces: spec.{field} must be unset or false")
    # Privileged Containers
    for path, c in containers:
        if (c.get("securityContext") or {}).get("privileged"):
            out.append(f"Privileged Containers: {path}.securityContext.privileged must be unset or false")
    # Capabilities (baseline: additions only from the allowed list)
    for path, c in containers:
        added = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        for cap in added:
            if cap not in BASELINE_ADDABLE_CAPABILITIES:
                out.append(f"Capabilities: {path}.securityContext.capabilities.add {cap!r} is not allowed")
    # HostPath Volumes
    for i, volume in enumerate(spec.get("volumes") or []):
        if "hostPath" in volume:
            out.append(f"HostPath Volumes: spec.volumes[{i}].hostPath is forbidden")
    # Host Ports
    for path, c in containers:
        for j, port in enumerate(c.get("ports") or []):
            if port.get("hostPort"):
                out.append(f"Host Ports: {path}.ports[{j}].hostPort must be unset or 0")
    # AppArmor
    for key, value in (meta.get("annotations") or {}).items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and value != "runtime/default" \
                and not str(value).startswith("localhost/"):
            out.append(f"AppArmor: annotation {key}={value!r} is not allowed")
    for path, sc in [("spec.securityContext", psc)] + [(f"{p}.securityContext", c.get("securityContext") or {})
                                                        for p, c in containers]:
        profile = (sc.get("appArmorProfile") or {}).get("type")
        if profile not in (None, "RuntimeDefault", "Localhost"):
            out.append(f"AppArmor: {path}.appArmorProfile.type {profile!r} is not allowed")
    # SELinux
    for path, sc in [("spec.securityContext", psc)] + [(f"{p}.securityContext", c.get("securityContext") or {})
                                                        for p, c in containers]:
        opts = sc.get("seLinuxOptions") or {}
        if opts.get("type", "") not in SELINUX_TYPES:
            out.append(f"SELinux: {path}.seLinuxOptions.type {opts.get('type')!r} is not allowed")
        for field in ("user", "role"):
            if opts.get(field):
                out.append(f"SELinux: {path}.seLinuxOptions.{field} must be unset")
    # /proc Mount Type
    for path, c in containers:
        proc = (c.get("securityContext") or {}).get("procMount")
        if proc not in (None, "Default"):
            out.append(f"/proc Mount Type: {path}.securityContext.procMount must be unset or Default")
    # Seccomp (baseline): never Unconfined
    for path, sc in [("spec.securityContext", psc)] + [(f"{p}.securityContext", c.get("securityContext") or {})
                                                        for p, c in containers]:
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"Seccomp: {path}.seccompProfile.type must not be Unconfined")
    # Sysctls
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"Sysctls: spec.securityContext.sysctls {sysctl.get('name')!r} is not in the safe set")

    # --- Restricted controls ---
    # Volume Types
    for i, volume in enumerate(spec.get("volumes") or []):
        sources = [k for k in volume if k != "name"]
        for source in sources:
            if source not in RESTRICTED_VOLUME_SOURCES:
                out.append(f"Volume Types: spec.volumes[{i}].{source} is not an allowed volume type")
    # Privilege Escalation: must be set to false on every container
    for path, c in containers:
        if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False:
            out.append(f"Privilege Escalation: {path}.securityContext.allowPrivilegeEscalation must be false")
    # Running as Non-root: pod-level true, or every container true; no container may set false
    pod_non_root = psc.get("runAsNonRoot") is True
    for path, c in containers:
        value = (c.get("securityContext") or {}).get("runAsNonRoot")
        if value is False or (value is None and not pod_non_root):
            out.append(f"Running as Non-root: {path}.securityContext.runAsNonRoot must be true "
                       "(or set it on the pod and leave the container unset)")
    # Running as Non-root user: runAsUser must not be 0
    if psc.get("runAsUser") == 0:
        out.append("Running as Non-root user: spec.securityContext.runAsUser must not be 0")
    for path, c in containers:
        if (c.get("securityContext") or {}).get("runAsUser") == 0:
            out.append(f"Running as Non-root user: {path}.securityContext.runAsUser must not be 0")
    # Seccomp (restricted): RuntimeDefault or Localhost, at pod level or on every container
    allowed = ("RuntimeDefault", "Localhost")
    pod_profile = (psc.get("seccompProfile") or {}).get("type")
    if pod_profile is not None and pod_profile not in allowed:
        out.append(f"Seccomp: spec.securityContext.seccompProfile.type {pod_profile!r} must be RuntimeDefault or "
                   "Localhost")
    for path, c in containers:
        profile = ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
        if profile is None and pod_profile not in allowed:
            out.append(f"Seccomp: {path}.securityContext.seccompProfile.type must be set (or set it on the pod)")
        elif profile is not None and profile not in allowed:
            out.append(f"Seccomp: {path}.securityContext.seccompProfile.type {profile!r} must be RuntimeDefault or "
                       "Localhost")
    # Capabilities (restricted): drop ALL, add at most NET_BIND_SERVICE
    for path, c in containers:
        caps = (c.get("securityContext") or {}).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"Capabilities: {path}.securityContext.capabilities.drop must include ALL")
        for cap in caps.get("add") or []:
            if cap != "NET_BIND_SERVICE":
                out.append(f"Capabilities: {path}.securityContext.capabilities.add {cap!r}: only NET_BIND_SERVICE "
                           "may be added")
    return out
