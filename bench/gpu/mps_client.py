"""One MPS client for mps_probe.sh. Modes: limit | hold S | small | loop S | fault. Prints JSON lines."""
import json
import os
import sys
import time


def say(**kw):
    kw["pid"] = os.getpid()
    kw["uid"] = os.getuid()
    kw["t"] = round(time.time(), 3)
    print(json.dumps(kw), flush=True)


mode = sys.argv[1]
try:
    import torch
    t0 = time.time()
    torch.zeros(1, device="cuda")
    free, total = torch.cuda.mem_get_info()
    say(event="ready", mode=mode, init_s=round(time.time() - t0, 2), free=free, total=total,
        limit_env=os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
    if mode == "limit":
        chunk = 64 * 2**20
        held = []
        try:
            while True:
                held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError as e:
            say(event="oom", allocated=len(held) * chunk, reserved=int(torch.cuda.memory_reserved()),
                message=str(e)[:600])
        free, total = torch.cuda.mem_get_info()
        say(event="after-oom", free=free, total=total)
        time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
    elif mode == "hold":
        x = torch.empty(int(sys.argv[3]) if len(sys.argv) > 3 else 512 * 2**20, dtype=torch.uint8, device="cuda")
        say(event="holding", bytes=x.numel())
        time.sleep(float(sys.argv[2]))
    elif mode == "small":
        x = torch.randn(1024, 1024, device="cuda")
        say(event="ran", sum=float((x @ x).sum().item()))
    elif mode == "loop":
        a = torch.randn(4096, 4096, device="cuda")
        end = time.time() + float(sys.argv[2])
        n = 0
        try:
            while time.time() < end:
                (a @ a).sum().item()
                n += 1
            say(event="loop-done", iterations=n)
        except Exception as e:  # noqa: BLE001
            say(event="loop-error", iterations=n, type=type(e).__name__, message=str(e)[:600])
            try:
                torch.zeros(1, device="cuda").item()
                say(event="after-error-usable")
            except Exception as e2:  # noqa: BLE001
                say(event="after-error-broken", message=str(e2)[:300])
    elif mode == "fault":
        import cupy as cp  # type: ignore[import-not-found]
        k = cp.RawKernel(r'extern "C" __global__ void k(unsigned long long p){ *((int*)p) = 1; }', "k")
        time.sleep(1.0)
        say(event="launching-fault")
        try:
            k((1,), (1,), (cp.uint64(0x10),))
            cp.cuda.runtime.deviceSynchronize()
            say(event="fault-not-raised")
        except Exception as e:  # noqa: BLE001
            say(event="fault-raised", type=type(e).__name__, message=str(e)[:600])
            print(f"CUDA error: {e}", file=sys.stderr, flush=True)
            os._exit(4)
except Exception as e:  # noqa: BLE001
    say(event="client-error", type=type(e).__name__, message=str(e)[:800])
    sys.exit(3)
