/*
 * A stand-in libnvidia-ml.so.1 for tests: just enough of the NVML C API for gnnsched's NVMLBackend, so the real
 * pynvml binding (ctypes, struct layouts, error codes) runs on a machine without a GPU.
 *
 * State comes from the text file named by $GNNSCHED_FAKE_NVML_STATE, re-read on every call so a test can change
 * it while a process runs. One record per line:
 *   gpu  <uuid> <name-without-spaces> <total-bytes> <used-bytes> <util-gpu-%|-1> <util-mem-%|-1>
 *   proc <gpu-index> <pid> <used-bytes|-1> <compute|mps>
 *   xid  <gpu-index> <xid>            (each xid line is delivered once, in order, by nvmlEventSetWait_v2)
 * Unknown lines are ignored. Written for this project; signatures follow the public nvml.h.
 *
 * Thread-safe as the real library is: a process calls NVML from several threads at once (the node agent's sampler
 * and its Xid watcher, the device plugin's refresh and its event thread; ctypes releases the GIL), and re-reading the
 * file resets the tables, so every entry point holds one lock around its re-read and its reads. Without it a reader
 * could see zero GPUs mid-reload, the backend raise, and the device plugin mark every slot Unhealthy for a moment.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <stdint.h>
#include <pthread.h>

#define OK 0
#define E_UNINIT 1
#define E_INVALID 2
#define E_NOT_SUPPORTED 3
#define E_INSUFFICIENT 7
#define E_TIMEOUT 10
#define E_UNKNOWN 999
#define MAXG 16
#define MAXP 64
#define MAXX 64

typedef struct { unsigned long long total, free, used; } mem_t;
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_t;
typedef struct { void *device; unsigned long long type, data; unsigned int gi, ci; } event_t;

struct gpu { char uuid[96], name[96]; unsigned long long total, used; long ug, um; };
struct prc { int gpu; unsigned int pid; long long used; int mps; };
struct xid { int gpu; unsigned long long xid; };

static struct gpu G[MAXG]; static int NG;
static struct prc P[MAXP]; static int NP;
static struct xid X[MAXX]; static int NX;
static int delivered; static int inited;
static int event_set_token;
static pthread_mutex_t M = PTHREAD_MUTEX_INITIALIZER;
#define LOCKED(type, name, params, args) \
    static type name##_locked params; \
    type name params { pthread_mutex_lock(&M); type r = name##_locked args; pthread_mutex_unlock(&M); return r; } \
    static type name##_locked params

static void load(void) {
    NG = NP = NX = 0;
    const char *path = getenv("GNNSCHED_FAKE_NVML_STATE");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[512], kind[16], a[96], b[96], mode[16];
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%15s", kind) != 1) continue;
        if (!strcmp(kind, "gpu") && NG < MAXG) {
            struct gpu *g = &G[NG];
            if (sscanf(line, "gpu %95s %95s %llu %llu %ld %ld", a, b, &g->total, &g->used, &g->ug, &g->um) == 6) {
                strcpy(g->uuid, a); strcpy(g->name, b); NG++;
            }
        } else if (!strcmp(kind, "proc") && NP < MAXP) {
            struct prc *p = &P[NP];
            if (sscanf(line, "proc %d %u %lld %15s", &p->gpu, &p->pid, &p->used, mode) == 4) {
                p->mps = !strcmp(mode, "mps"); NP++;
            }
        } else if (!strcmp(kind, "xid") && NX < MAXX) {
            if (sscanf(line, "xid %d %llu", &X[NX].gpu, &X[NX].xid) == 2) NX++;
        }
    }
    fclose(f);
}

static int idx(void *h) { intptr_t i = (intptr_t)h - 1; return (i >= 0 && i < NG) ? (int)i : -1; }

int nvmlInitWithFlags(unsigned int flags) { (void)flags; inited++; return OK; }
int nvmlInit_v2(void) { inited++; return OK; }
int nvmlShutdown(void) { if (!inited) return E_UNINIT; inited--; return OK; }

const char *nvmlErrorString(int r) {
    switch (r) {
    case OK: return "Success";
    case E_UNINIT: return "Uninitialized";
    case E_INVALID: return "Invalid Argument";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_INSUFFICIENT: return "Insufficient Size";
    case E_TIMEOUT: return "Timeout";
    default: return "Unknown Error";
    }
}

LOCKED(int, nvmlDeviceGetCount_v2, (unsigned int *n), (n)) { if (!inited) return E_UNINIT; load(); *n = (unsigned)NG; return OK; }

LOCKED(int, nvmlDeviceGetHandleByIndex_v2, (unsigned int i, void **h), (i, h)) {
    load(); if (i >= (unsigned)NG) return E_INVALID; *h = (void *)(intptr_t)(i + 1); return OK;
}

LOCKED(int, nvmlDeviceGetUUID, (void *h, char *buf, unsigned int len), (h, buf, len)) {
    load(); int i = idx(h); if (i < 0) return E_INVALID;
    if (strlen(G[i].uuid) + 1 > len) return E_INSUFFICIENT;
    strcpy(buf, G[i].uuid);
    return OK;
}

LOCKED(int, nvmlDeviceGetName, (void *h, char *buf, unsigned int len), (h, buf, len)) {
    load(); int i = idx(h); if (i < 0) return E_INVALID;
    if (strlen(G[i].name) + 1 > len) return E_INSUFFICIENT;
    strcpy(buf, G[i].name);
    return OK;
}

LOCKED(int, nvmlDeviceGetMemoryInfo, (void *h, mem_t *m), (h, m)) {
    load(); int i = idx(h); if (i < 0) return E_INVALID;
    m->total = G[i].total; m->used = G[i].used; m->free = G[i].total - G[i].used; return OK;
}

LOCKED(int, nvmlDeviceGetUtilizationRates, (void *h, util_t *u), (h, u)) {
    load(); int i = idx(h); if (i < 0) return E_INVALID;
    if (G[i].ug < 0) return E_NOT_SUPPORTED;
    u->gpu = (unsigned)G[i].ug; u->memory = (unsigned)G[i].um; return OK;
}

static int procs(void *h, unsigned int *count, proc_t *out, int mps) {
    load(); int i = idx(h); if (i < 0) return E_INVALID;
    unsigned int n = 0;
    for (int k = 0; k < NP; k++) if (P[k].gpu == i && P[k].mps == mps) n++;
    if (n == 0) { *count = 0; return OK; }
    if (!out || *count < n) { *count = n; return E_INSUFFICIENT; }
    unsigned int j = 0;
    for (int k = 0; k < NP; k++) if (P[k].gpu == i && P[k].mps == mps) {
        out[j].pid = P[k].pid; out[j].used = P[k].used < 0 ? ~0ULL : (unsigned long long)P[k].used;
        out[j].gi = out[j].ci = 0xFFFFFFFFu; j++;
    }
    *count = n; return OK;
}
LOCKED(int, nvmlDeviceGetComputeRunningProcesses_v3, (void *h, unsigned int *c, proc_t *o), (h, c, o)) {
    return procs(h, c, o, 0);
}
LOCKED(int, nvmlDeviceGetMPSComputeRunningProcesses_v3, (void *h, unsigned int *c, proc_t *o), (h, c, o)) {
    return procs(h, c, o, 1);
}

int nvmlEventSetCreate(void **set) { *set = &event_set_token; return OK; }
int nvmlEventSetFree(void *set) { (void)set; return OK; }
LOCKED(int, nvmlDeviceRegisterEvents, (void *h, unsigned long long types, void *set), (h, types, set)) {
    (void)types; (void)set; load(); return idx(h) < 0 ? E_INVALID : OK;
}

int nvmlEventSetWait_v2(void *set, event_t *ev, unsigned int timeout_ms) {
    (void)set;
    for (unsigned int waited = 0;; waited += 10) {
        pthread_mutex_lock(&M);  /* not held while it sleeps: the other threads' calls go on meanwhile */
        load();
        if (delivered < NX) {
            ev->device = (void *)(intptr_t)(X[delivered].gpu + 1);
            ev->type = 0x8; /* nvmlEventTypeXidCriticalError */
            ev->data = X[delivered].xid; ev->gi = ev->ci = 0xFFFFFFFFu;
            delivered++;
            pthread_mutex_unlock(&M);
            return OK;
        }
        pthread_mutex_unlock(&M);
        if (waited >= timeout_ms) return E_TIMEOUT;
        usleep(10000);
    }
}
