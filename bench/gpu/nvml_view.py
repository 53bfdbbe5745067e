import json

import pynvml

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
def rows(fn):
    try:
        return [{"pid": p.pid, "used": p.usedGpuMemory} for p in fn(h)]
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
print(json.dumps({"compute": rows(pynvml.nvmlDeviceGetComputeRunningProcesses),
                  "mps_compute": rows(getattr(pynvml, "nvmlDeviceGetMPSComputeRunningProcesses", lambda h: [])),
                  "device_used": pynvml.nvmlDeviceGetMemoryInfo(h).used}))
try:
    for p in rows(pynvml.nvmlDeviceGetComputeRunningProcesses):
        with open(f"/proc/{p['pid']}/cmdline") as fh:
            print(p["pid"], fh.read().replace("\0", " ")[:100])
except Exception as e:  # noqa: BLE001
    print("cmdline:", e)
