"""N worlds of one robot stepped by MuJoCo Warp (``env.physics: mujoco_warp``) on
``env.device``: the same MjModel as :class:`~.physics.BatchedPhysics` (scene.build_model), the
same state layout, delay line, sensors and randomisation, in MuJoCo Warp's kernels.

- **One model, batched parameters.** MuJoCo Warp reads a model field with a leading world axis
  as ``field[world]``. Randomisation is written into the CPU model copies by the code the CPU
  engine runs (:meth:`BatchedPhysics.set_physical_params`, one source of truth), each copy's
  row is kept in a host stack ``[C, ...]``, and the worlds' rows ``[N, ...]`` go to the device
  when a reset changed them (BATCHED lists the fields).
- **Host state.** ``state`` ``[N, nstate]`` (time, qpos, qvel, act), ``sensordata`` and the
  per-physics-step readings stay numpy arrays the env reads and writes (resets, pushes); they
  are uploaded before and read back after each physics step. Warp computes in float32.
- **What it leaves out**: box-ground terrain (each world's own box window; use the
  heightfield) and per-world torsional friction (MuJoCo Warp cannot batch ``geom_condim``)
  are refused by the env config; worlds whose contacts or constraints overflowed MuJoCo Warp's
  buffers count as diverged (the env resets them).
"""

from __future__ import annotations

from typing import Any, Mapping

import mujoco
import numpy as np

from ..config import ConfigError
from .physics import BatchedPhysics
from .robot_spec import RobotSpec

# Model fields randomisation writes (physics.BatchedPhysics.set_physical_params), batched per
# world on the device.
BATCHED = ('geom_friction', 'body_mass', 'body_inertia', 'body_ipos', 'actuator_gainprm',
           'actuator_biasprm', 'dof_frictionloss', 'dof_damping', 'dof_armature', 'geom_solref')
# Contacts [per world] and constraint rows [per world] MuJoCo Warp allocates: the claw
# standing has 12 foot contacts and 24 joint friction / limit rows.
CONTACTS_PER_WORLD = 64


def import_warp() -> tuple[Any, Any]:
    """(warp, mujoco_warp), imported on first use (the CPU engine needs neither)."""
    try:
        import warp
        # Errors only: no banner, no line per kernel compiled, no warning that a CPU-only
        # machine has no CUDA driver (env.device cuda says so itself, as a config error).
        warp.config.log_level = warp.LOG_ERROR
        import mujoco_warp
    except ImportError as error:
        raise ConfigError('env.physics', '', f'mujoco_warp: {error}; install the project '
                          '(make venv: mujoco-warp and warp-lang are in requirements.txt)') \
            from error
    warp.init()
    return warp, mujoco_warp


def warp_device(device: str) -> str:
    """Warp's name of ``env.device`` (cpu, cuda); a ConfigError naming the key where there is
    no CUDA device: nothing falls back to the CPU without saying so."""
    wp, _ = import_warp()
    if device == 'cpu':
        return 'cpu'
    if device == 'cuda':
        if not wp.is_cuda_available():
            raise ConfigError('env.device', '', 'cuda: Warp finds no CUDA device on this '
                              f'machine (devices: {[str(d) for d in wp.get_devices()]}); set '
                              'env.device: cpu, or run on a machine with an NVIDIA GPU and '
                              'its driver (docs/gpu.md)')
        return 'cuda:0'
    raise ConfigError('env.device', '', f'{device!r}: use cpu or cuda')


class WarpPhysics(BatchedPhysics):
    """BatchedPhysics' API and state, stepped by MuJoCo Warp on ``device`` (module docstring).
    """

    def __init__(self, robot: RobotSpec, num_envs: int, *, device: str = 'cpu',
                 **options: Any):
        options['num_threads'] = 1  # the CPU side only recomputes the sensors after resets
        super().__init__(robot, num_envs, **options)
        if self.ground is not None:
            raise ValueError('env.physics mujoco_warp: env.terrain.collision boxes gives each '
                             'world its own ground boxes; use collision heightfield')
        wp, mjw = self._wp, self._mjw = import_warp()
        self.device = warp_device(device)
        m = self.model
        with wp.ScopedDevice(self.device):
            self.wmodel = mjw.put_model(m)
            self.wdata = mjw.put_data(m, mujoco.MjData(m), nworld=num_envs,
                                      nconmax=CONTACTS_PER_WORLD,
                                      njmax=4 * CONTACTS_PER_WORLD + 3 * m.nv)
        # Buffer overflows (contacts, constraint rows) leave physics out: those worlds count
        # as diverged. Reaching the solver's iteration limits is normal (4 Newton iterations,
        # as on the CPU); nothing is printed from the kernels.
        flags = mjw.OverflowType
        self._lost_physics = int(flags.ALL & ~(flags.ITERATIONS | flags.LS_ITERATIONS))
        self.wmodel.opt.warn_overflow = 0
        # Each copy's randomised fields [C, ...] (updated by set_physical_params).
        self._copy_fields = {name: np.stack([getattr(c, name) for c in self.copies])
                             for name in BATCHED}
        self._params_changed = True
        self._overflow = np.zeros(num_envs, dtype=bool)

    def set_physical_params(self, copy_id: int, params: Mapping[str, np.ndarray]) -> None:
        super().set_physical_params(copy_id, params)
        copy = self.copies[copy_id]
        for name, stack in self._copy_fields.items():
            stack[copy_id] = getattr(copy, name)
        self._params_changed = True

    def use_copies(self, ids: np.ndarray, copies: np.ndarray) -> None:
        super().use_copies(ids, copies)
        self._params_changed = True

    def _upload_params(self) -> None:
        """Every world's row of the batched fields to the device (after resets changed any)."""
        wp = self._wp
        for name, stack in self._copy_fields.items():
            dtype = getattr(self.wmodel, name).dtype
            rows = np.ascontiguousarray(stack[self.copy_of], dtype=np.float32)
            setattr(self.wmodel, name, wp.array(rows, dtype=dtype, device=self.device))
        self._params_changed = False

    def _put(self, target: Any, values: np.ndarray) -> None:
        target.assign(np.ascontiguousarray(values, dtype=np.float32))

    def step(self, targets: np.ndarray, latency: np.ndarray) -> np.ndarray:
        """Advance every world ``decimation`` physics steps (BatchedPhysics.step's contract)."""
        ctrl = self.delayed_ctrl(targets, latency)
        if self._params_changed:
            self._upload_params()
        d, dt, m = self.wdata, self.model.opt.timestep, self.model
        # The env's state (resets, pushes) to the device; the clock stays float64 on the host.
        self._put(d.qpos, self.qpos)
        self._put(d.qvel, self.qvel)
        if m.na:
            self._put(d.act, self.state[:, 1 + m.nq + m.nv:])
        # Each control step's first physics step starts the solver cold, as the CPU engine's
        # rollout call does (mjSTATE_FULLPHYSICS carries no warm start).
        d.qacc_warmstart.zero_()
        time = self.state[:, 0].copy()
        self._overflow[:] = False
        kp, kd = self.copy_kp[self.copy_of], self.copy_kd[self.copy_of]
        for s in range(self.decimation):
            if self.actuator is None:
                self._put(d.ctrl, ctrl[:, s])
            else:
                # A learned actuator's torques from this step's state, between physics steps.
                q, qd = self.qpos[:, self.qadr], self.qvel[:, self.vadr]
                self._put(d.ctrl, self.actuator.torque(ctrl[:, s] - q, qd, kp, kd))
            self._mjw.step(self.wmodel, d)
            out = self._out_state[:, s]
            out[:, 0] = time + (s + 1) * dt
            out[:, self.qpos_slice] = d.qpos.numpy()
            out[:, self.qvel_slice] = d.qvel.numpy()
            if m.na:
                out[:, 1 + m.nq + m.nv:] = d.act.numpy()
            self.sensordata[:, s] = d.sensordata.numpy()
            self._overflow |= (d.overflow.numpy() & self._lost_physics) != 0
            self.state[:] = out
        # A world whose contacts or constraints overflowed stepped with some left out.
        self._auto_reset = self._overflow.copy()
        return self.sensordata

    def close(self) -> None:
        super().close()
        self.wmodel = self.wdata = None
