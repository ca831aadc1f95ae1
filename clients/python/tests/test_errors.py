"""Error mapping and the retry hint, against an in-process gRPC server that
refuses the way brokerd does (RetryInfo and ErrorInfo in the status
details): brokerd sends RetryInfo only under overload, which a test cannot
produce on demand."""

import unittest
from concurrent import futures

import grpc

import brokerd
from brokerd import errors
from brokerd._gen import brokerd_rpc_pb2
from brokerd._gen.broker.v1 import broker_pb2_grpc


def status_details(code, message, retry_seconds=None, reason=None, metadata=None):
    st = brokerd_rpc_pb2.Status(code=code.value[0], message=message)
    if retry_seconds is not None:
        ri = brokerd_rpc_pb2.RetryInfo()
        ri.retry_delay.FromMilliseconds(int(retry_seconds * 1000))
        st.details.add().Pack(ri, type_url_prefix="type.googleapis.com/")
        st.details[-1].type_url = "type.googleapis.com/google.rpc.RetryInfo"
    if reason is not None:
        ei = brokerd_rpc_pb2.ErrorInfo(reason=reason, domain="brokerd", metadata=metadata or {})
        st.details.add().Pack(ei)
        st.details[-1].type_url = "type.googleapis.com/google.rpc.ErrorInfo"
    return st.SerializeToString()


class Refusing(broker_pb2_grpc.BrokerServiceServicer):
    def ListDevices(self, request, context):
        context.set_trailing_metadata([("grpc-status-details-bin",
                                        status_details(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", 0.25))])
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")

    def LoadModel(self, request, context):
        context.set_trailing_metadata([("grpc-status-details-bin",
                                        status_details(grpc.StatusCode.PERMISSION_DENIED, "needs admin",
                                                       reason="ROLE_REQUIRED", metadata={"role": "admin"}))])
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "needs admin")

    def GetStats(self, request, context):
        context.abort(grpc.StatusCode.INTERNAL, "a bug")


class TestErrors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        broker_pb2_grpc.add_BrokerServiceServicer_to_server(Refusing(), cls.server)
        port = cls.server.add_insecure_port("127.0.0.1:0")
        cls.server.start()
        cls.c = brokerd.Client(address=f"127.0.0.1:{port}", timeout=10)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.server.stop(None)

    def test_retry_hint(self):
        with self.assertRaises(errors.ResourceExhausted) as cm:
            self.c.devices()
        e = cm.exception
        self.assertEqual(e.retry_after, 0.25)
        self.assertTrue(e.retryable)
        self.assertEqual(brokerd.retry_delay(e), 0.25)

    def test_error_info(self):
        with self.assertRaises(errors.PermissionDenied) as cm:
            self.c.load("x")
        self.assertEqual((cm.exception.reason, cm.exception.metadata), ("ROLE_REQUIRED", {"role": "admin"}))
        self.assertIsNone(cm.exception.retry_after)
        self.assertFalse(cm.exception.retryable)

    def test_no_details(self):
        with self.assertRaises(errors.Internal) as cm:
            self.c.stats()
        self.assertEqual(cm.exception.message, "a bug")
        self.assertEqual(brokerd.retry_delay(cm.exception), 0.0)

    def test_backoff_without_hint(self):
        e = errors.Unavailable(grpc.StatusCode.UNAVAILABLE, "draining")
        self.assertEqual(brokerd.retry_delay(e, 0.0), 0.005)
        self.assertEqual(brokerd.retry_delay(e, 0.04), 0.08)
        self.assertEqual(brokerd.retry_delay(e, 0.9), 1.0)


if __name__ == "__main__":
    unittest.main()
