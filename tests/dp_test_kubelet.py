"""A test kubelet: the kubelet side of the device plugin API v1beta1 over real gRPC on unix sockets.

It behaves as kubelet's device manager does where the plugin can observe it:
* serves ``Registration`` on ``<dir>/kubelet.sock``;
* on ``Register`` checks the API version, dials the plugin's endpoint and calls ``GetDevicePluginOptions``
  *before* answering (so a plugin that registers before serving fails, as with the real kubelet);
* then opens ``ListAndWatch`` and records every device list it receives;
* ``restart()`` does what a kubelet restart does to the directory: its server goes away, every socket in the
  directory is removed, and a new ``kubelet.sock`` appears.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from gnnsched.device_plugin.v1beta1 import api_pb2 as pb
from gnnsched.device_plugin.v1beta1 import api_pb2_grpc as pb_grpc


class TestKubelet(pb_grpc.RegistrationServicer):
    __test__ = False  # not a pytest class

    def __init__(self, plugin_dir: Path) -> None:
        self.dir = Path(plugin_dir)
        self.cond = threading.Condition()
        self.registrations: list[pb.RegisterRequest] = []
        self.options: list[pb.DevicePluginOptions] = []
        self.lists: list[list[tuple[str, str]]] = []  # every ListAndWatch message, as (ID, health)
        self._server: grpc.Server | None = None
        self._channels: list[grpc.Channel] = []
        self.plugin: pb_grpc.DevicePluginStub | None = None

    # -- kubelet side ----------------------------------------------------------------------------------------
    def Register(self, request, context):  # noqa: N802
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        channel = grpc.insecure_channel(f"unix://{self.dir / request.endpoint}")
        stub = pb_grpc.DevicePluginStub(channel)
        try:
            opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=2)
        except grpc.RpcError as exc:
            channel.close()
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot reach plugin: {exc.code().name}")
        stream = stub.ListAndWatch(pb.Empty())
        with self.cond:
            self._channels.append(channel)
            self.registrations.append(request)
            self.options.append(opts)
            self.plugin = stub
            self.cond.notify_all()
        threading.Thread(target=self._consume, args=(stream,), daemon=True).start()
        return pb.Empty()

    def _consume(self, stream) -> None:
        try:
            for resp in stream:
                with self.cond:
                    self.lists.append([(d.ID, d.health) for d in resp.devices])
                    self.cond.notify_all()
        except grpc.RpcError:
            pass  # stream ends when the plugin or this kubelet goes away

    # -- test controls ---------------------------------------------------------------------------------------
    def start(self) -> None:
        sock = self.dir / "kubelet.sock"
        sock.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        with self.cond:
            channels, self._channels = self._channels, []
        for c in channels:
            c.close()

    def restart(self) -> None:
        self.stop()
        for f in self.dir.iterdir():
            if f.suffix == ".sock":
                f.unlink()
        time.sleep(0.01)  # a distinct ctime for the new socket even on coarse clocks
        self.start()

    def wait_for(self, predicate: Callable[[], object], timeout: float = 20.0) -> bool:
        with self.cond:
            return bool(self.cond.wait_for(predicate, timeout))

    def latest(self) -> dict[str, str]:
        with self.cond:
            return dict(self.lists[-1]) if self.lists else {}
