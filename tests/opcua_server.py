"""A real asyncua OPC UA server on a free loopback port for the tests, in a thread with its own event
loop: variables by name in namespace urn:optimizer-tests (node ids "ns=2;s=<name>"), written with a
StatusCode of the test's choosing; started and stopped by the test (a context manager)."""

import asyncio
import threading

from asyncua import Server, ua

from servers import free_port

NAMESPACE = "urn:optimizer-tests"


INITIAL = {ua.VariantType.String: "", ua.VariantType.Boolean: False}


class PlantServer:
    """`types`: a variable's data type by name (default Double)."""

    def __init__(self, names, port: int | None = None, types: dict | None = None):
        self.names, self.port, self.types = list(names), port or free_port(), dict(types or {})
        self.url = f"opc.tcp://127.0.0.1:{self.port}/plant"
        self.nodes: dict = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="opcua-test-server", daemon=True)
        self._server = None

    def node_id(self, name: str) -> str:
        return f"ns=2;s={name}"

    def _call(self, coroutine, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    async def _start(self) -> None:
        self._server = Server()
        await self._server.init()
        self._server.set_endpoint(self.url)
        self._server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
        index = await self._server.register_namespace(NAMESPACE)
        assert index == 2
        plant = await self._server.nodes.objects.add_object(index, "Plant")
        for name in self.names:
            kind = self.types.get(name, ua.VariantType.Double)
            initial = ua.Variant(INITIAL.get(kind, 0), kind)
            self.nodes[name] = await plant.add_variable(ua.NodeId(name, index), name, initial, varianttype=kind)
            await self.nodes[name].set_writable()
        await self._server.start()

    def start(self) -> "PlantServer":
        self._thread.start()
        self._call(self._start())
        return self

    def set(self, name: str, value: float, status: int = ua.StatusCodes.Good) -> None:
        """Write `value` with `status` (e.g. ua.StatusCodes.BadSensorFailure, UncertainLastUsableValue)."""
        data = ua.DataValue(ua.Variant(float(value), ua.VariantType.Double), StatusCode=ua.StatusCode(status))
        self._call(self.nodes[name].write_value(data))

    def get(self, name: str):
        """The variable's current value and its VariantType."""
        value = self._call(self.nodes[name].read_data_value()).Value
        return value.Value, value.VariantType

    async def _crash(self) -> None:
        # asyncua's own stop() waits for its connections to close, and a client that reconnects within
        # it keeps one open for 30 s: stop listening first, then drop every connection, as a dying
        # process would (the server's listener and transports are asyncua internals)
        self._server.bserver._server.close()
        for transport in list(self._server.iserver.asyncio_transports):
            transport.abort()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    def close(self) -> None:
        """Go away as a crashed server does: listener and connections dropped at once."""
        if self._server is not None:
            self._call(self._crash())
            self._server = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "PlantServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
