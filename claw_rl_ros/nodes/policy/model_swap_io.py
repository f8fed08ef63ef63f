"""The policy node's hot-swap wiring (thin ROS glue around core/control/model_swap.py).

* ``policy/model`` (``std_msgs/UInt8MultiArray``, reliable + transient local: late joiners get
  the bytes): a worker thread validates each model on arrival (size cap, ONNX parse, shapes,
  embedded robot spec, finite probe actions; 15-25 ms for 600 KB, mostly outside the GIL, so
  control ticks go on) and keeps the verdict by sha256;
* parameter ``model_sha256`` (the standard ``set_parameters`` service) activates that version
  between two ticks, waiting for a validation still under way; ``model_path`` loads a file
  (humans). The ``SetParametersResult`` says success or the exact reason; a rejected model
  leaves the old one serving;
* ``policy/model_version`` (``std_msgs/String``, latched): the version served, after each swap.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
import hashlib

from rcl_interfaces.msg import SetParametersResult
from std_msgs.msg import String, UInt8MultiArray

from ...core.control.model_swap import ModelNotReceived, ModelRejected
from ..ros_io import LATCHED_QOS, publisher

# Seconds an activation waits for the validation of bytes still in the pool.
VALIDATION_WAIT_S = 10.0


class ModelSwapIO:
    """Model bytes in, activation by parameter, version out (see the module docstring)."""

    def __init__(self, node, ctrl):
        self.node, self.ctrl, self.log = node, ctrl, node.get_logger()
        self.pool = ThreadPoolExecutor(1)
        self.validating: dict[str, Future] = {}
        self.pub_version = publisher(node, String, 'policy/model_version', LATCHED_QOS)
        node.create_subscription(UInt8MultiArray, 'policy/model', self.on_model, LATCHED_QOS)
        node.add_on_set_parameters_callback(self.on_set_parameters)
        self.publish_version()

    def on_model(self, msg: UInt8MultiArray) -> None:
        data = bytes(msg.data)
        sha = hashlib.sha256(data).hexdigest()
        self.validating[sha] = self.pool.submit(self.validate, sha, data)
        self.validating[sha].add_done_callback(lambda f, sha=sha: self.validating.pop(sha, None))

    def validate(self, sha: str, data: bytes) -> str | None:
        """(In the pool.) Offer the bytes; the outcome is logged before the result is out, so
        an activation waiting on it replies after the line."""
        try:
            reason = self.ctrl.offer(data)[1]
        except Exception as exc:  # noqa: BLE001 - logged, then raised to the waiter
            self.log.warning(f'model {sha[:12]} received and rejected: {exc}')
            raise
        if reason:
            self.log.warning(f'model {sha[:12]} received and rejected: {reason}')
        else:
            self.log.debug(f'model {sha[:12]} received and validated')
        return reason

    def on_set_parameters(self, params) -> SetParametersResult:
        for p in params:
            try:
                if p.name == 'model_sha256' and p.value:
                    for sha, future in list(self.validating.items()):
                        if sha.startswith(p.value.strip().lower()):
                            future.result(timeout=VALIDATION_WAIT_S)
                    self.ctrl.activate(p.value)
                elif p.name == 'model_path' and p.value:
                    self.ctrl.load_path(p.value)
                else:  # the others are read-only (refused by rclpy) or use_sim_time
                    continue
            except Exception as exc:  # noqa: BLE001 - ModelRejected, a timeout, anything
                reason = str(exc) if isinstance(exc, ModelRejected) else \
                    f'{p.name}: {type(exc).__name__}: {exc}'
                # Bytes still in flight: the requester has the reason and retries. (One
                # severity per call site: rclpy refuses a logger call that changes it.)
                if isinstance(exc, ModelNotReceived):
                    self.log.debug(f'hot swap rejected: {reason}')
                else:
                    self.log.warning(f'hot swap rejected: {reason}')
                return SetParametersResult(successful=False, reason=reason)
            self.log.debug(f'hot swap: now serving {self.ctrl.version}')
            self.publish_version()
        return SetParametersResult(successful=True, reason=f'serving {self.ctrl.version}')

    def publish_version(self) -> None:
        self.pub_version.publish(String(data=self.ctrl.version))
