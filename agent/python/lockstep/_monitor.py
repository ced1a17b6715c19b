"""Monitor: the object a training script holds (docs/design.md "Agent").

    mon = lockstep.Monitor(run="glm-npu-01", role="candidate", experiment="glm",
                           endpoint="tcp://127.0.0.1:6200")
    mon.watch(model, optimizer=opt)
    for step, batch in enumerate(data):
        ...; loss.backward(); opt.step(); opt.zero_grad()
        mon.step(loss=loss, lr=sched.get_last_lr()[0])
    mon.close()

Steps are numbered from ``start_step`` (0): what is recorded before the first step()
belongs to step start_step. Nothing here raises into the training loop: errors are
counted and warned about once (lockstep._guard). Methods are for the training thread;
hooks may run on autograd's threads under the GIL.
"""
from __future__ import annotations

import atexit
import math
import threading
import time
import warnings
import weakref
from typing import Any, Dict, Iterable, Mapping, Optional, Pattern, Union

import torch

from lockstep import _args, _capture, _config, _control, _core, _fingerprint, _zoom
from lockstep._device import DevicePipeline
from lockstep._guard import Guard
from lockstep._identity import Identity
from lockstep._recorder import KIND, Recorder
from lockstep._replicas import ReplicaCheck
from lockstep._session import Session
from lockstep._tune import ThreadTuner
from lockstep._watch import DEFAULT_KINDS, HookSwitch, Watch, sampling

_live = weakref.WeakSet()  # open monitors, closed at interpreter exit
_AT_EXIT_TIMEOUT_S = 2.0


def _close_all_at_exit():
    for mon in list(_live):
        mon.close(timeout=min(_AT_EXIT_TIMEOUT_S, mon._close_timeout))


atexit.register(_close_all_at_exit)


def _weak_call(method_ref):
    """A function calling the method behind `method_ref` (a WeakMethod) while it lives."""
    def call(*args, **kwargs):
        method = method_ref()
        return None if method is None else method(*args, **kwargs)
    return call


def _remove_watches(watches):
    """The hooks of a Monitor that was collected without close()."""
    for w in watches:
        try:
            w.remove()
        except Exception:  # pylint: disable=broad-except
            pass


_STEP_ARGS = ("loss", "lr", "loss_scale", "grad_norm", "samples")


def _disable_requested():
    """(LOCKSTEP_DISABLE asks for it, the warning to give or None); never raises."""
    try:
        return _config.disable_requested()
    except Exception:  # pylint: disable=broad-except
        return False, None


class Monitor:
    """Watches a model and ships its statistics to a lockstep collector.

    Every argument left as None comes from ``LOCKSTEP_<NAME>`` or its default:
    run (a generated id), role ("solo"; or "baseline"/"candidate"), experiment (""),
    endpoint ("tcp://127.0.0.1:6200"), platform / device_name (detected: cpu, cuda,
    npu), rank / world_size (torch.distributed, else RANK / WORLD_SIZE, else 0 / 1),
    sketch_k (32), hist_bins (16), start_step (0), queue_capacity, send_hwm, send_buffer_mb,
    close_timeout (5 s), heartbeat_interval (1 s), curve_server_key (the collector's
    CURVE public key or its .pub file: turns on encryption and authentication) and
    curve_key (this agent's .key file from ``lockstep keygen``; default a fresh pair),
    see docs/security.md. host_stats_thread ("auto"; "on", "off"): compute CPU tensors'
    statistics on a lockstep thread while the step goes on; "auto" turns it on when
    torch's intra-op threads leave a core idle (docs/python.md). capture (True),
    capture_dir ("lockstep-captures"), capture_mb (256), capture_limit (3): whether
    capture() may save ops, where, and its bounds (docs/python.md "Capture and
    replay"). replica_check_every (100; 0 = off): every M-th recorded step of a
    DistributedDataParallel job, each rank records its all-reduced gradients for the
    collector's replica check (docs/python.md "The replica check"). config: an optional dict
    (e.g. ``vars(args)``) that joins the run fingerprint, which the collector compares
    between the two runs (docs/python.md "Run fingerprint"). Arguments are keyword-only.
    A configuration mistake (an unknown argument included) warns with one sentence and
    gives a disabled monitor (``strict=True`` raises ValueError); so does
    ``LOCKSTEP_DISABLE=1``, silently: ``enabled`` is False, every method a no-op, nothing
    is hooked.
    """

    def _refuse_call(self, message, args, kwargs):
        """__init__ called with arguments it does not have (lenient)."""
        self._disabled_init(kwargs.get("run"))
        if _disable_requested()[0]:
            return  # LOCKSTEP_DISABLE: not a word, whatever the arguments
        if kwargs.get("strict") is True:
            raise ValueError("lockstep: %s (see docs/python.md)" % message)
        self._guard.warn("%s (see docs/python.md); this Monitor records nothing" % message)

    def _disabled_init(self, run):
        self._guard = Guard()
        self._agent = None
        self._closed = False
        self._watches = []
        self._zooms = []
        self._captures = None
        self._close_timeout = 5.0
        self._warned_args = set()
        self.enabled = False
        self.run = run if isinstance(run, str) else None

    @_args.lenient(_refuse_call)
    def __init__(self, *, run: Optional[str] = None, role: Optional[str] = None,
                 experiment: Optional[str] = None, endpoint: Optional[str] = None,
                 platform: Optional[str] = None, rank: Optional[int] = None,
                 world_size: Optional[int] = None, sketch_k: Optional[int] = None,
                 hist_bins: Optional[int] = None, start_step: Optional[int] = None,
                 device_name: Optional[str] = None, queue_capacity: Optional[int] = None,
                 send_hwm: Optional[int] = None, send_buffer_mb: Optional[int] = None,
                 close_timeout: Optional[float] = None,
                 heartbeat_interval: Optional[float] = None,
                 curve_server_key: Optional[str] = None, curve_key: Optional[str] = None,
                 host_stats_thread: Union[str, bool, None] = None,
                 control_endpoint: Optional[str] = None,
                 capture: Optional[bool] = None,
                 capture_dir: Optional[str] = None,
                 capture_mb: Optional[float] = None, capture_limit: Optional[int] = None,
                 replica_check_every: Optional[int] = None,
                 config: Optional[Mapping[str, Any]] = None, strict: bool = False,
                 _force_device_path: bool = False) -> None:
        self._disabled_init(run)
        disabled, warning = _disable_requested()
        if warning is not None:
            self._guard.warn(warning)
        if disabled:
            return  # LOCKSTEP_DISABLE: every method a no-op, nothing hooked
        strict = strict is True  # only a real True raises (a hostile object cannot)
        args = dict(run=run, role=role, experiment=experiment, endpoint=endpoint,
                    platform=platform, rank=rank, world_size=world_size, sketch_k=sketch_k,
                    hist_bins=hist_bins, start_step=start_step, device_name=device_name,
                    queue_capacity=queue_capacity, send_hwm=send_hwm,
                    send_buffer_mb=send_buffer_mb, close_timeout=close_timeout, heartbeat_interval=heartbeat_interval,
                    curve_server_key=curve_server_key, curve_key=curve_key,
                    host_stats_thread=host_stats_thread, control_endpoint=control_endpoint,
                    capture=capture, capture_dir=capture_dir, capture_mb=capture_mb,
                    capture_limit=capture_limit, replica_check_every=replica_check_every)
        try:
            user_config = _config.user_config(config)
            cfg = _config.resolve(args)
            self._ident = Identity(rank, world_size, cfg)
            self._agent = self._create_agent(cfg, strict)
        except ValueError as e:
            if strict:
                raise
            self._guard.warn("%s; this Monitor records nothing" % str(e).replace(
                "lockstep: ", "", 1))
            return
        except Exception as e:  # pylint: disable=broad-except  (never into the job)
            if strict:
                raise
            self._guard.warn("Monitor() could not start (%s: %s); this Monitor records nothing"
                             % (type(e).__name__, _config.safe_repr(str(e), 200)))
            return
        try:
            self._start(cfg, user_config, _force_device_path)
        except Exception as e:  # pylint: disable=broad-except  (never into the job)
            if strict:
                raise
            try:
                self._agent.close(0.0)
            except Exception:  # pylint: disable=broad-except
                pass
            self.enabled = False
            _live.discard(self)
            self._guard.warn("Monitor() could not start (%s: %s); this Monitor records nothing"
                             % (type(e).__name__, _config.safe_repr(str(e), 200)))

    def _create_agent(self, cfg, strict):
        def create(control):
            return _core.Agent.create(
                endpoint=cfg["endpoint"], run=cfg["run"], experiment=cfg["experiment"],
                role=cfg["role"], platform=cfg["platform"], device_name=cfg["device_name"],
                framework=cfg["framework"], rank=cfg["rank"], world_size=cfg["world_size"],
                start_step=cfg["start_step"], queue_capacity=cfg["queue_capacity"],
                send_hwm=cfg["send_hwm"], send_buffer_mb=cfg["send_buffer_mb"],
                sketch_k=cfg["sketch_k"],
                hist_bins=cfg["hist_bins"], heartbeat_interval_s=cfg["heartbeat_interval"],
                curve_server_key=cfg["curve"][0], curve_public_key=cfg["curve"][1],
                curve_secret_key=cfg["curve"][2], identity_pending=self._ident.pending,
                control_endpoint=control)
        try:
            return create(cfg["control_endpoint"])
        except ValueError as e:
            # The control channel is optional: a bad control_endpoint loses it, not the
            # statistics (a bad anything else still stops the Monitor).
            if strict or not cfg["control_endpoint"] or "control_endpoint" not in str(e):
                raise
            agent = create("")
            self._guard.warn("%s; this Monitor records without a control channel" % str(e).replace(
                "lockstep: ", "", 1))
            cfg["control_endpoint"] = ""
            return agent

    def _start(self, cfg, user_config, _force_device_path):
        self.config = cfg
        self.run, self.role, self.rank = cfg["run"], cfg["role"], cfg["rank"]
        self.platform = cfg["platform"]
        if cfg.get("run_defaulted"):
            self._guard.warn("no run id given (run= or LOCKSTEP_RUN); using %r" % cfg["run"])
        self._close_timeout = cfg["close_timeout"]
        self._tuner = None
        if cfg["host_stats_thread"]:
            try:
                self._agent.start_host_worker(256)
                if cfg["host_stats_thread_tune"]:
                    self._tuner = ThreadTuner()
            except ValueError as e:  # no thread to be had: the statistics stay inline
                self._guard.warn("%s; computing CPU statistics on the training thread"
                                 % str(e).replace("lockstep: ", "", 1))
        self._lock = threading.Lock()
        # Called back weakly: the hooks reach the pipeline, and must not keep self alive.
        self._pipeline = DevicePipeline(cfg["sketch_k"], cfg["hist_bins"],
                                        _weak_call(weakref.WeakMethod(self._ship)))
        self._rec = Recorder(self._agent, cfg["sketch_k"], cfg["hist_bins"], self._pipeline,
                             self._guard, force_device_path=_force_device_path)
        if self._tuner is not None:
            self._rec.set_threaded(self._tuner.next_mode())
        self._step = cfg["start_step"]
        self._every = 1  # watch(every=): the user's stride, the floor of any other
        self._sample = None  # the collector's stride (control action "sample"), or None
        self._sample_pending = []  # (first step, k) asked for, not yet reached
        self._patterns = []  # (include, exclude) of each watch(), for the wire's Sampling
        self._rec.new_step(self._step)
        # What the hooks share with this Monitor; they hold it weakly (lockstep._session).
        self._session = Session(self._rec, self._guard, self._ident,
                                weakref.WeakMethod(self._check_identity),
                                weakref.WeakMethod(self._note_first_forward))
        self._watches = self._session.watches
        self._session.replicas = ReplicaCheck(cfg["replica_check_every"],
                                              self._pipeline.flush_deferred)
        # The hooks are out of torch's tables on the steps not recorded (_watch.HookSwitch).
        self._hook_switch = HookSwitch(self._guard.warn)
        self._captures = _capture.Captures(self._session, cfg, self._guard)
        # A Monitor collected while its model lives takes its hooks out.
        weakref.finalize(self, _remove_watches, self._watches)
        self._t_last = time.perf_counter()
        self._user_config = user_config
        self._fingerprint = _fingerprint.Fingerprint(_weak_call(weakref.WeakMethod(
            self._set_fingerprint)), self._guard.fail)
        self._next_delivery_check = self._t_last + 1.0  # None once warned
        self.enabled = True
        _live.add(self)

    # ---- public API ---------------------------------------------------------------

    def _refuse_watch(self, message, _args_, _kwargs):
        if self.enabled and not self._closed:
            self._guard.warn(message + "; nothing is watched")
        return self

    @_args.lenient(_refuse_watch)
    def watch(self, model: Optional[torch.nn.Module] = None,
              optimizer: Optional[torch.optim.Optimizer] = None, *,
              include: Union[str, Pattern[str], None] = None,
              exclude: Union[str, Pattern[str], None] = None, every: int = 1,
              kinds: Iterable[str] = DEFAULT_KINDS, params: bool = False,
              optim_state: bool = False) -> "Monitor":
        """Hooks ``model`` (and reads ``optimizer``'s state when optim_state=True).
        include / exclude: regular expressions on module and parameter names.
        every: record tensors every N steps (scalars are recorded every step).
        kinds "input" (the model's forward inputs) and "init" (the parameters once,
        before the first update) are on by default; watch() also sends the run
        fingerprint (docs/python.md "Run fingerprint").
        Returns self. A bad argument warns once and watches nothing."""
        if not self.enabled or self._closed:
            return self
        try:
            every, kinds = _args.check_watch_args(optimizer, include, exclude, every, kinds,
                                                  params, optim_state)
            sess = self._session
            w = Watch(sess, model, optimizer, include, exclude, kinds, params, optim_state)
            self._watches.append(w)
            self._every = every
            sess.replicas.stride = every
            self._patterns.append((include, exclude))
            self._send_sampling()
            sess.active = self._step % self._stride() == 0
            if self._ident.pending:  # the process group may be up by now
                self._check_identity(release=False)
            self._fingerprint.add_watch(self.config, model, optimizer, self._user_config,
                                        self._step)
            if sess.active and len(self._watches) == 1:
                if self._ident.pending:
                    sess.init_pending = w
                else:
                    w.record_initial()
        except ValueError as e:
            self._guard.warn(str(e).replace("lockstep: ", "", 1))
        except Exception as e:  # pylint: disable=broad-except
            self._guard.fail("watch()", e)
        return self

    def _refuse_step(self, message, args, kwargs):
        """step() with arguments it does not have: warned once, and the step is recorded
        with the arguments it does have."""
        if self.enabled and not self._closed:
            self._warn_arg("step()", message + "; ignored")
        known = {k: v for k, v in kwargs.items() if k in _STEP_ARGS}
        return self.step(*args[:1], **known) if not (args[:1] and "loss" in known) \
            else self.step(**known)

    @_args.lenient(_refuse_step)
    def step(self, loss: Union[float, torch.Tensor, None] = None, *,
             lr: Union[float, torch.Tensor, None] = None, loss_scale: Any = None,
             grad_norm: Union[float, torch.Tensor, None] = None,
             samples: Optional[int] = 0) -> None:
        """Closes the current step: records scalars (loss, lr, loss_scale — a number,
        tensor or GradScaler —, grad_norm, step time) and ships the step's records.
        A value that cannot be used (samples=-1, loss="0.5", a 10-element tensor) is
        dropped with one warning per argument; the step is recorded without it."""
        if not self.enabled or self._closed:
            return
        s = self._step
        if self._ident.open or self._ident.pending:
            self._check_identity(release=True)
        try:
            loss_v = self._arg("loss", loss, _args.scalar)
            if loss_v is None:
                loss = None
            lr_v = self._arg("lr", lr, _args.scalar)
            grad_norm_v = self._arg("grad_norm", grad_norm, _args.scalar)
            loss_scale_v = self._arg("loss_scale", loss_scale, _args.loss_scale)
            samples_v = self._arg("samples", samples, _args.samples)
        except Exception as e:  # pylint: disable=broad-except
            self._guard.fail("step()", e)
            loss = loss_v = lr_v = grad_norm_v = loss_scale_v = samples_v = None
        try:
            now = time.perf_counter()
            step_time, self._t_last = now - self._t_last, now
            rec = self._rec
            if self._active:
                try:  # a failure here must not lose the step's scalars and EndStep
                    rec.settle(wait=True)  # the host thread's results come before EndStep
                    for w in self._watches:
                        w.record_step_end()
                    if isinstance(loss, torch.Tensor) and any(
                            "loss" in w.kinds for w in self._watches):
                        rec.record("loss", KIND["loss"], loss.detach().reshape(-1))
                except Exception as e:  # pylint: disable=broad-except
                    self._guard.fail("step()", e)
            nan = math.nan
            # Which scalars the caller gave (and were usable): a given NaN loss is sent
            # as NaN, not as "none".
            # (the converted values are NaN for an argument left at None)
            given = (loss is not None and loss_v is not None) \
                | (lr is not None and lr_v is not None) << 1 \
                | (grad_norm is not None and grad_norm_v is not None) << 2 \
                | (loss_scale is not None and loss_scale_v is not None) << 3
            if grad_norm is None or grad_norm_v is None:
                grad_norm_v = _args.host_scalar(self._accum_grad_norm)
            scalars = {
                "loss": nan if loss_v is None else loss_v, "lr": nan if lr_v is None else lr_v,
                "grad_norm": grad_norm_v,
                "loss_scale": nan if loss_scale_v is None else loss_scale_v,
                "step_time_s": step_time, "micro_steps": rec.micro + 1,
                "samples": samples_v or 0,
                "given": given,
                "host_grad_sq": rec.grad_sq if rec.grad_count else None,
            }
            self._end_step(s, scalars)
            if self._next_delivery_check is not None and now >= self._next_delivery_check:
                self._check_delivery(now)
            if self._tuner is not None and self._active and rec.t_first is not None:
                self._tuner.add(rec._threaded, now - rec.t_first)
        except Exception as e:  # pylint: disable=broad-except
            self._guard.fail("step()", e)
        try:  # the step number advances whatever happened above
            self._advance(s + 1)
        except Exception as e:  # pylint: disable=broad-except
            self._guard.fail("step()", e)

    def _warn_arg(self, name, message):
        """One RuntimeWarning per argument name and monitor."""
        if name in self._warned_args:
            return
        self._warned_args.add(name)
        self._guard.warn(message)

    def _arg(self, name, value, convert):
        """convert(value), or None with one warning per argument when it cannot be used."""
        try:
            return convert(value)
        except Exception as e:  # pylint: disable=broad-except  (hostile __float__ and kin)
            why = str(e) if isinstance(e, ValueError) else "%s: %s" % (type(e).__name__, e)
            self._warn_arg(name, "step(%s=%s) is not valid: %s; the value is dropped (this "
                           "warning is given once per argument)"
                           % (name, _config.safe_repr(value), why))
            return None

    def zoom(self, module: str, steps: int = 2) -> bool:
        """Records every torch function call in ``module``'s own code (a module of a
        watched model, by its name in the rows: ``"blocks.1.attn"``) as rows of their
        own, ``module/func#k``, for ``steps`` steps: this step when nothing of it has
        been recorded yet, else from the next (docs/python.md "Zoom"). Both runs must zoom
        the same module at the same step for the calls to pair. Returns whether the zoom
        is set up; a module not found or a bad ``steps`` warns once."""
        return self._zoom(module, steps, None) is None

    def _zoom(self, module, steps, at):
        """zoom(), from step `at` (None: this step or the next, as zoom() says): None when
        set up, else why not (warned once)."""
        if not self.enabled or self._closed:
            return "the monitor is closed"
        try:
            _zoom.check_args(module, steps)
            found = _capture.find_module(self._watches, module)
            if found is None:
                raise ValueError("zoom(%r): no module of a watched model has that name (the "
                                 "names of the rows: 'blocks.1.attn', '<root>')" % module)
            first = self._next_unrecorded_step()
            if at is not None:
                first = max(first, at)
            _zoom.zoom_of(self._zooms, self._session, found[0], found[1], module, first,
                          first + steps - 1, self._records_kind("act_grad"))
            return None
        except ValueError as e:
            why = str(e)
            self._warn_arg("zoom()", why)
        except Exception as e:  # pylint: disable=broad-except
            why = "%s: %s" % (type(e).__name__, e)
            self._guard.fail("zoom()", e)
        return why

    def _records_kind(self, kind):
        """Whether one of the watches records `kind`."""
        return any(kind in w.kinds for w in self._watches)

    def _stride(self):
        """Tensors are recorded at steps divisible by this. The collector's stride is
        rounded up to a multiple of the user's watch(every=N): it may thin what the user
        chose to record, never record steps the user left out (docs/python.md
        "Sampling the collector asks for")."""
        k, every = self._sample, self._every
        return every if k is None else -(-k // every) * every

    def _sample_from(self, k, at):
        """The control action "sample": tensors every k-th step (step % stride == 0)
        from step `at` (or the next unrecorded step, when that one is past). Returns
        (first step, stride then)."""
        first = max(self._next_unrecorded_step(), at)
        self._sample_pending.append((first, k))
        self._apply_sampling(self._step)
        return first, -(-k // self._every) * self._every

    def _apply_sampling(self, step):
        """The strides asked for whose first step is `step` or earlier take effect
        (in the order asked); the collector is told the new sampling."""
        due = [p for p in self._sample_pending if p[0] <= step]
        if not due:
            return
        self._sample_pending = [p for p in self._sample_pending if p[0] > step]
        before = self._stride()
        self._sample = due[-1][1]
        if self._stride() != before:
            if step == self._step and self._rec.order == 0 and self._rec.micro == 0:
                self._session.active = step % self._stride() == 0
            self._send_sampling()

    def _next_unrecorded_step(self):
        """This step while nothing of it has been recorded, else the next."""
        rec = self._rec
        return self._step if (rec.order == 0 and rec.micro == 0) else self._step + 1

    def capture(self, name: str, step: Optional[int] = None) -> bool:
        """Saves one op at step ``step`` (default: the next step not yet recording) for
        `python -m lockstep replay` (docs/python.md "Capture and replay"): ``name`` is a
        row as the collector names a birth point, a module (``"blocks.1.mlp.act"``, a call
        suffix ``#k`` allowed) or a call in its own code (``"blocks.1.attn/softmax#0"``,
        which zooms the module for that step). In the forward of that step it takes the
        op's inputs, outputs, parameters, buffers and settings, the RNG state and dtypes;
        a writer thread saves them. Returns whether the capture is set up; a step already
        past, a name not found, capture off or the run's captures used up warn once."""
        if not self.enabled or self._closed:
            return False
        caps = self._captures
        try:
            def zoom_for(root, module, path, at):
                if not _zoom.available():
                    raise ValueError("capture(%r) needs a zoom, which needs torch >= 1.13"
                                     % name)
                return _zoom.zoom_of(self._zooms, self._session, root, module, path, at, at,
                                     self._records_kind("act_grad"))

            return caps.request(name, step, self._next_unrecorded_step(),
                                lambda path: _capture.find_module(self._watches, path),
                                zoom_for)
        except ValueError as e:
            caps.refused += 1
            self._warn_arg("capture()", str(e))
        except Exception as e:  # pylint: disable=broad-except
            caps.refused += 1
            self._guard.fail("capture()", e)
        return False

    def flush(self, timeout: float = 5.0) -> bool:
        """Ships every finished step and waits until the agent has handed it to the
        socket. Returns False on timeout. Never raises."""
        if not self.enabled or self._closed:
            return True
        if self._ident.open or self._ident.pending:
            self._check_identity(release=True)
        try:
            deadline = time.monotonic() + timeout
            self._rec.settle(wait=True)
            ok = self._pipeline.drain(deadline)
            return self._agent.flush(max(0.0, deadline - time.monotonic())) and ok
        except Exception as e:  # pylint: disable=broad-except
            self._guard.fail("flush()", e)
            return False

    def close(self, timeout: Optional[float] = None) -> bool:
        """Removes the hooks, ships what is recorded (a step left open is closed),
        says goodbye and stops the agent, in at most ``timeout`` seconds (default
        close_timeout) — also when no collector is listening. Idempotent."""
        if not self.enabled or self._closed:
            return True
        self._closed = True
        self._session.closed = True
        _live.discard(self)
        timeout = self._close_timeout if timeout is None else timeout
        deadline = time.monotonic() + max(0.0, timeout)
        ok = True
        if self._ident.open or self._ident.pending:
            self._check_identity(release=False)  # Close() sends what is held anyway
        try:
            for w in self._watches:
                w.remove()
            for z in self._zooms:
                z.remove()
            self._zooms = []
            rec = self._rec
            rec.settle(wait=True)
            if rec.order > 0 or rec.micro > 0 or self._pipeline.has_rows():
                self._end_step(self._step, {"micro_steps": rec.micro + 1,
                                            "host_grad_sq": None})
            ok = self._pipeline.drain(deadline)
            ok = self._captures.close(deadline) and ok
        except Exception as e:  # pylint: disable=broad-except
            self._guard.fail("close()", e)
            ok = False
        try:
            ok = self._agent.close(max(0.0, deadline - time.monotonic())) and ok
        except Exception as e:  # pylint: disable=broad-except
            self._guard.fail("close()", e)
            ok = False
        return ok

    def counters(self) -> Dict[str, Any]:
        """Agent counters (records enqueued/sent/dropped, ...) plus the Python side's:
        python_errors, tensors_recorded, tensors_repeated, tensors_threaded (statistics
        computed on the host statistics thread), tensors_changed_in_flight (their results
        dropped: changed in place before the thread read them), tensors_skipped,
        tensors_failed, steps; captures_written, captures_refused, captures_failed,
        captures_pending, capture_files (Monitor.capture); host_stats_thread (whether the next step uses the host
        statistics thread) and host_stats_thread_ratio ("auto": the last measured step
        time with the thread over without it, None before the first measurement)."""
        out = {}
        if self._agent is not None:
            try:
                out.update(self._agent.counters())
            except Exception as e:  # pylint: disable=broad-except
                self._guard.fail("counters()", e)
        rec = getattr(self, "_rec", None)
        out["python_errors"] = self._guard.count
        out["last_python_error"] = self._guard.last
        if rec is not None:
            out.update(rec.counters())
            tuner = self._tuner
            out["host_stats_thread_ratio"] = tuner.ratio if tuner is not None else None
            out["device_steps_dropped"] = self._pipeline.dropped_steps
            out["steps"] = self._step - self.config["start_step"]
        if self._captures is not None:
            out.update(self._captures.counters())
        return out

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False

    # ---- internals ----------------------------------------------------------------

    # step() reads these two; they live in the Session the hooks share.
    @property
    def _active(self):
        return self._session.active

    @property
    def _accum_grad_norm(self):
        return self._session.accum_grad_norm

    def _advance(self, step):
        self._step = step
        if self._zooms:
            for z in [z for z in self._zooms if z.last < step]:
                z.remove()
                self._zooms.remove(z)
        if self._captures is not None and self._captures.requests:
            self._captures.new_step(step)  # a capture whose step passed is refused
        self._rec.new_step(step)
        if self._tuner is not None:
            self._rec.set_threaded(self._tuner.next_mode())
        if self._sample_pending:
            self._apply_sampling(step)
        self._session.new_step(self._stride(), step)
        if self._agent.has_requests():  # the collector asked for something (one load)
            _control.act(self, self._agent.take_requests(), step)
        self._hook_switch.sync(self._watches, self._session.active)

    def _check_identity(self, release):
        """The rank again, once torch.distributed is initialised (_identity.py)."""
        try:
            ident = self._ident
            ident.check(self._agent, self._guard.warn, self._step)
            if release:
                ident.release(self._agent)
            self.rank = ident.rank
            self.config["rank"], self.config["world_size"] = ident.rank, ident.world
            self._fingerprint.set_rank(ident.rank, ident.world)
        except Exception as e:  # pylint: disable=broad-except
            self._guard.fail("reading the rank from torch.distributed", e)

    def _set_fingerprint(self, entries):
        self._agent.set_fingerprint(entries)

    def _note_first_forward(self):
        """At the first watched forward: the autocast state joins the fingerprint."""
        self._fingerprint.note_first_forward(self.platform)

    def _check_delivery(self, now):
        """Warns once when nothing reached a collector (the agent's sender thread decides
        and names the endpoint); at most one cheap call a second."""
        self._next_delivery_check = now + 1.0
        problem = self._agent.delivery_problem()
        if problem:
            self._next_delivery_check = None
            self._guard.warn(problem)

    def _send_sampling(self):
        """The job's sampling to the collector (schema Sampling, _watch.sampling)."""
        try:  # informational: a failure here must not cut watch() short
            self._agent.set_sampling(self._stride(), *sampling(self._patterns, self._watches,
                                                                self._session.replicas))
        except Exception as e:  # pylint: disable=broad-except
            self._guard.fail("the sampling", e)

    def _end_step(self, step, scalars):
        p = self._pipeline
        device_scalar = any(isinstance(v, torch.Tensor) for v in scalars.values())
        if p.busy() or p.has_rows() or device_scalar:
            p.end_step(step, scalars)  # shipped when its copy lands (in step order)
        else:
            self._ship(step, None, None, None, None, None, scalars)

    def _ship(self, step, rows, micros, ids, orders, device_grad_sq, scalars, flags=None):
        """Hands one finished step to the agent: its rows, scalars, then EndStep."""
        agent = self._agent
        if rows is not None and len(rows):
            if flags is None:
                agent.record_packed(step, micros, ids, orders, rows)
            else:  # some rows repeat a tensor recorded before them (kStatRepeat)
                agent.record_packed(step, micros, ids, orders, rows, flags)
        nan = math.nan
        grad_norm = scalars.get("grad_norm", nan)
        micro_steps = int(scalars.get("micro_steps", 1))
        if grad_norm != grad_norm and micro_steps == 1:
            # Without accumulation the global norm is exact from the per-tensor norms.
            parts = [g for g in (scalars.get("host_grad_sq"), device_grad_sq) if g is not None]
            if parts:
                grad_norm = math.sqrt(sum(parts))
        if "loss" in scalars:
            agent.record_scalars(step, scalars.get("loss", nan), scalars.get("lr", nan),
                                 grad_norm, scalars.get("loss_scale", nan),
                                 scalars.get("step_time_s", nan), micro_steps,
                                 scalars.get("samples", 0), scalars.get("given", 0))
        agent.end_step(step)
