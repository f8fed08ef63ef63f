"""The sim node's episodes: the sim2sim gate's unit of measurement (thin glue over
core/verify/episode_record.py).

* parameter ``episode_seed`` (the sim's only writable parameter; >= 0: every ``~/reset`` draws
  from the stream of (``seed``, ``episode_seed``), whatever ran before it; -1: one stream);
* ``~/reset`` (``std_srvs/Trigger``) resets the world and re-sends the state under the same
  stamp; with ``pause_after_s`` it also starts recording the episode;
* ``pause_after_s`` after the reset the episode is due: the node pauses and the episode's
  states go out as one record on ``~/episode`` (:meth:`~.sim_state_io.SimStateIO.send_episode`).
"""

from __future__ import annotations

import numpy as np
from rcl_interfaces.msg import SetParametersResult
from std_srvs.srv import Trigger

from ...core.verify.episode_record import episode_steps, EpisodeRecorder
from ...core.params.node_config import check_episode_seed


class SimEpisodeIO:
    """Episode seed, ``~/reset`` and the recorded episode of a sim node (module docstring)."""

    def __init__(self, node):
        self.node = node
        self.seed = node.params.episode_seed
        self.recorder: EpisodeRecorder | None = None  # the episode pause_after_s ends
        node.add_on_set_parameters_callback(self.on_set_parameters)
        node.create_service(Trigger, '~/reset', self.on_reset)

    def record(self, stamp: float, r) -> None:
        """Add a published state (``r``: the sim's readings) to the episode under way."""
        if self.recorder is not None:
            self.recorder.add(stamp, r.base_lin_vel, r.base_ang_vel, r.joint_pos,
                              r.joint_effort)

    def due(self) -> bool:
        """Whether the episode under way has its last state out (after a step)."""
        return self.recorder is not None and self.node.sim.steps >= self.recorder.end_step

    def send(self) -> None:
        """Send the finished episode on ``~/episode`` and stop recording."""
        self.node.out.send_episode(self.recorder)
        self.recorder = None

    def on_reset(self, request, response):
        n = self.node
        answered, p = n.awaiting is None, n.params
        if self.seed >= 0:  # this episode's own draws, whatever ran before it
            n.sim.rng = np.random.default_rng([p.seed, self.seed])
        n.sim.reset()
        if p.pause_after_s:
            self.recorder = EpisodeRecorder(n.robot.joint_names, n.sim.steps,
                                            episode_steps(p.pause_after_s, n.robot.control_dt))
        n.publish_state()  # same stamp: a policy that answered it already stays quiet
        if answered:
            n.awaiting = None
        response.success, response.message = True, f'reset #{n.sim.resets}'
        return response

    def on_set_parameters(self, params) -> SetParametersResult:
        for param in params:  # the others are read-only (refused by rclpy) or use_sim_time
            if param.name == 'episode_seed':
                try:
                    check_episode_seed(param.value)
                except (TypeError, ValueError) as exc:
                    return SetParametersResult(successful=False, reason=str(exc))
                self.seed = param.value
        return SetParametersResult(successful=True)
