# MPS on this GPU: memory-limit semantics, NVML's view of clients, one-UID rule, fault domain. Needs setup.sh.
set -u
R=/tmp/mps; rm -rf $R; mkdir -p $R/pipe $R/log; chmod 0777 $R $R/pipe $R/log
export CUDA_MPS_PIPE_DIRECTORY=$R/pipe CUDA_MPS_LOG_DIRECTORY=$R/log
C="bench/gpu/mps_client.py"
echo "== binaries"; which nvidia-cuda-mps-control nvidia-cuda-mps-server nvidia-smi
nvidia-smi --query-gpu=name,compute_mode,memory.total,driver_version --format=csv
nvidia-cuda-mps-control -d; echo "control rc=$?"; sleep 1
echo "== limit 2048M"; CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M timeout 60 python3 $C limit 4 &
sleep 6; echo "== nvml while the limited client holds"; python3 bench/gpu/nvml_view.py; wait
echo "== limit 1024M"; CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M timeout 60 python3 $C limit 0
echo "== limit in plain bytes (the gate's format: 0=<bytes>) 1073741824"; CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1073741824 timeout 60 python3 $C limit 0
echo "== two clients: nvml view"; timeout 60 python3 $C hold 8 $((1024*1024*1024)) & timeout 60 python3 $C hold 8 $((300*1024*1024)) &
sleep 5; python3 bench/gpu/nvml_view.py; wait
echo "== second uid while a root client holds"; timeout 60 python3 $C hold 12 &
sleep 4; HOME=/tmp timeout 25 setpriv --reuid=65534 --regid=65534 --clear-groups python3 $C small; echo "uid65534 rc=$? (124 = still waiting after 25 s)"; wait
echo "== second uid with no root client"; sleep 2; HOME=/tmp timeout 40 setpriv --reuid=65534 --regid=65534 --clear-groups python3 $C small; echo "uid65534 alone rc=$?"
echo "== root after uid 65534's server"; sleep 2; timeout 40 python3 $C small; echo "root rc=$?"
echo "== fault domain"; timeout 60 python3 $C loop 25 & sleep 3; timeout 40 python3 $C fault; echo "fault rc=$?"
sleep 1; echo "-- a new client right after the fault"; timeout 20 python3 $C small; echo "new client rc=$? (124 = waited 20 s)"
wait; echo "-- a new client after all exited"; sleep 2; timeout 40 python3 $C small; echo "rc=$?"
echo "== logs"; tail -n 40 $R/log/control.log; tail -n 60 $R/log/server.log
echo quit | nvidia-cuda-mps-control; sleep 1; cp $R/log/*.log "${OUT:-.}"/ 2>/dev/null; true
