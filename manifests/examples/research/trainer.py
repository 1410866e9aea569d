#!/usr/bin/env python3
"""An example research trainer that listens for nightshift's reclaim notice.

It simulates training (one step every STEP_SECONDS) and checkpoints its state atomically to
CHECKPOINT_DIR/checkpoint.json:

- every CHECKPOINT_EVERY seconds;
- as soon as the pod gets a reclaim notice it has not handled yet: the annotation
  nightshift.io/reclaim-notice appears (or changes) in the file named by NIGHTSHIFT_NOTICE_FILE,
  the Downward API file nightshift's webhook mounts in research pods (read once a second);
- when nightshift POSTs to CHECKPOINT_PATH on CHECKPOINT_PORT (served only when the variable is
  set; 0 lets the system pick a port, which is logged);
- on SIGTERM (preemption or deletion): a last checkpoint, then exit 0.

After a notice it keeps training (a notice may be withdrawn) and remembers the notice it handled,
so the same notice is not checkpointed twice. On start it resumes from the checkpoint, if any.

Standard library only. Settings (environment):
  CHECKPOINT_DIR    where checkpoint.json is written (default /checkpoints)
  CHECKPOINT_EVERY  seconds between periodic checkpoints (default 600)
  CHECKPOINT_PORT   port of the checkpoint endpoint (default: no endpoint)
  CHECKPOINT_HOST   address it listens on (default: all)
  CHECKPOINT_PATH   path of the endpoint (default /checkpoint)
  NIGHTSHIFT_NOTICE_FILE  the pod's annotations file (set by nightshift's webhook)
  STEP_SECONDS      seconds per simulated step (default 1)
  TOTAL_STEPS       steps to train before exiting 0 (default 36000; 0: forever)
Exit status 2: the settings are invalid (the example Job does not retry that).
"""

import argparse
import http.server
import json
import os
import select
import signal
import socket
import sys
import threading
import time

NOTICE_ANNOTATION = "nightshift.io/reclaim-notice"
CHECKPOINT_FILE = "checkpoint.json"
# The kubelet refreshes Downward API files within its sync period; once a second costs nothing
# and is far below the grace period a notice buys.
NOTICE_POLL_SECONDS = 1.0
# Largest request body read from the checkpoint endpoint: nightshift's is a few hundred bytes.
MAX_BODY_BYTES = 64 * 1024
EXIT_BAD_CONFIG = 2


def log(message, **fields):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    extra = "".join(f" {k}={v}" for k, v in fields.items())
    print(f"{stamp} trainer: {message}{extra}", flush=True)


class ConfigError(Exception):
    pass


def env_number(name, default, minimum):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not value >= minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum}")
    return value


# ---- the Downward API file ------------------------------------------------------------------

_SIMPLE_ESCAPES = {
    "a": b"\a",
    "b": b"\b",
    "f": b"\f",
    "n": b"\n",
    "r": b"\r",
    "t": b"\t",
    "v": b"\v",
    "\\": b"\\",
    '"': b'"',
    "'": b"'",
}


def go_unquote(quoted):
    """Decodes a Go double-quoted string (strconv.Quote), as the kubelet writes values."""
    if len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
        raise ValueError("not a quoted string")
    body = quoted[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        if i + 1 >= len(body):
            raise ValueError("dangling backslash")
        e = body[i + 1]
        if e in _SIMPLE_ESCAPES:
            out += _SIMPLE_ESCAPES[e]
            i += 2
        elif e in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i + 2 : i + 2 + width]
            if len(digits) != width:
                raise ValueError("short escape")
            code = int(digits, 16)
            out += bytes([code]) if e == "x" else chr(code).encode("utf-8", "surrogatepass")
            i += 2 + width
        elif e in "01234567":
            digits = body[i + 1 : i + 4]
            if len(digits) != 3:
                raise ValueError("short octal escape")
            out.append(int(digits, 8) & 0xFF)
            i += 4
        else:
            raise ValueError(f"unknown escape \\{e}")
    return out.decode("utf-8", "replace")


def parse_annotations(text):
    """Reads `key="value"` lines; lines that do not parse are skipped."""
    annotations = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or not key:
            continue
        try:
            annotations[key] = go_unquote(value)
        except ValueError:
            continue
    return annotations


def read_text(path):
    """The file's content, or None when it cannot be read (not mounted, being replaced)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


# ---- checkpoints ----------------------------------------------------------------------------


def write_atomically(directory, name, data):
    """Writes `data` to directory/name so that a reader sees the old or the new file, whole."""
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, name))
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Trainer:
    def __init__(self, checkpoint_dir):
        self.checkpoint_dir = checkpoint_dir
        self.step = 0
        self.loss = 4.0
        self.checkpoints = 0
        self.handled_notice = None
        self._resume()

    def _resume(self):
        path = os.path.join(self.checkpoint_dir, CHECKPOINT_FILE)
        text = read_text(path)
        if text is None:
            return
        try:
            state = json.loads(text)
            self.step = int(state["step"])
            self.loss = float(state["loss"])
            self.checkpoints = int(state.get("checkpoints", 0))
        except (ValueError, KeyError, TypeError):
            log("checkpoint unreadable, starting over", path=path)
            return
        log("resumed", step=self.step, path=path)

    def train_step(self):
        self.step += 1
        # Any curve that goes down will do for a simulation.
        self.loss = 0.5 + 3.5 / (1.0 + self.step / 500.0)

    def checkpoint(self, reason, notice=None):
        self.checkpoints += 1
        state = {
            "step": self.step,
            "loss": round(self.loss, 6),
            "checkpoints": self.checkpoints,
            "reason": reason,
            "notice": notice,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        data = (json.dumps(state, sort_keys=True) + "\n").encode("utf-8")
        write_atomically(self.checkpoint_dir, CHECKPOINT_FILE, data)
        fields = {"n": self.checkpoints, "step": self.step, "reason": reason}
        if notice is not None:
            fields["notice"] = notice
        log("checkpoint written", **fields)


# ---- the checkpoint endpoint ----------------------------------------------------------------


class Wakeup:
    """Wakes the main loop from other threads and from signal handlers."""

    def __init__(self):
        self.reader, self.writer = socket.socketpair()
        self.reader.setblocking(False)
        self.writer.setblocking(False)

    def wake(self):
        try:
            self.writer.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # Already awake: a byte is waiting.

    def wait(self, timeout):
        select.select([self.reader], [], [], max(0.0, timeout))
        try:
            while self.reader.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass


def serve_checkpoints(host, port, path, requests, wakeup):
    """Serves POST `path`: queues a checkpoint and answers 202 at once (writing one may take
    longer than the caller waits). Returns the server; its port is logged."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            if self.path.split("?", 1)[0] != path:
                self._answer(404, {"error": f"POST {path} to ask for a checkpoint"})
                return
            try:
                length = min(int(self.headers.get("Content-Length") or 0), MAX_BODY_BYTES)
            except ValueError:
                length = 0
            body = self.rfile.read(length) if length > 0 else b""
            try:
                notice = json.loads(body) if body else {}
            except ValueError:
                notice = {}
            if not isinstance(notice, dict):
                notice = {}
            requests.append(notice)
            wakeup.wake()
            self._answer(202, {"accepted": True})

        def do_GET(self):
            self._answer(405, {"error": f"POST {path} to ask for a checkpoint"})

        def _answer(self, status, body):
            data = json.dumps(body).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args):
            pass  # The main loop logs what the request caused.

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="checkpoint-http", daemon=True)
    thread.start()
    bound = server.server_address
    log("checkpoint endpoint listening", address=f"{bound[0]}:{bound[1]}", path=path)
    return server


# ---- main loop ------------------------------------------------------------------------------


def main(argv):
    parser = argparse.ArgumentParser(description="Example trainer listening for reclaim notices")
    # The pipeline's step arguments, logged (a real trainer would read and write these).
    for name in ("--config", "--input", "--output", "--resume"):
        parser.add_argument(name)
    args, unknown = parser.parse_known_args(argv)
    try:
        checkpoint_every = env_number("CHECKPOINT_EVERY", 600.0, 0.001)
        step_seconds = env_number("STEP_SECONDS", 1.0, 0.001)
        total_steps = int(env_number("TOTAL_STEPS", 36000, 0))
        port_text = os.environ.get("CHECKPOINT_PORT", "").strip()
        port = None if not port_text else int(env_number("CHECKPOINT_PORT", 0, 0))
        if port is not None and port > 65535:
            raise ConfigError(f"CHECKPOINT_PORT={port_text!r} is not a port")
    except ConfigError as e:
        log("invalid settings", error=str(e))
        return EXIT_BAD_CONFIG
    checkpoint_dir = os.environ.get("CHECKPOINT_DIR") or "/checkpoints"
    notice_file = os.environ.get("NIGHTSHIFT_NOTICE_FILE") or None
    endpoint_path = os.environ.get("CHECKPOINT_PATH") or "/checkpoint"
    log(
        "starting",
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        notice_file=notice_file or "-",
        args=json.dumps({k: v for k, v in vars(args).items() if v is not None} | {"other": unknown}),
    )

    wakeup = Wakeup()
    stop = []

    def on_signal(signum, _frame):
        stop.append(signum)

    signal.set_wakeup_fd(wakeup.writer.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    trainer = Trainer(checkpoint_dir)
    requests = []
    if port is not None:
        try:
            serve_checkpoints(os.environ.get("CHECKPOINT_HOST", ""), port, endpoint_path, requests, wakeup)
        except OSError as e:
            log("cannot listen for checkpoint requests", port=port, error=str(e))
            return EXIT_BAD_CONFIG

    now = time.monotonic()
    next_step = now + step_seconds
    next_checkpoint = now + checkpoint_every
    next_poll = now
    last_text = None
    while True:
        if stop:
            trainer.checkpoint("signal")
            log("stopping", signal=signal.Signals(stop[0]).name)
            return 0
        while requests:
            request = requests.pop(0)
            trainer.checkpoint("request", notice=request.get("noticeAt"))
        now = time.monotonic()
        if notice_file and now >= next_poll:
            next_poll = now + NOTICE_POLL_SECONDS
            text = read_text(notice_file)
            if text is not None and text != last_text:
                last_text = text
                annotations = parse_annotations(text)
                notice = annotations.get(NOTICE_ANNOTATION)
                if notice and notice != trainer.handled_notice:
                    log("reclaim notice", notice=notice)
                    trainer.checkpoint("notice", notice=notice)
                    trainer.handled_notice = notice
                log(
                    "annotations read",
                    count=len(annotations),
                    notice=notice or "-",
                    handled=trainer.handled_notice or "-",
                )
        if now >= next_step:
            trainer.train_step()
            next_step += step_seconds
            if next_step < now:
                next_step = now + step_seconds
            if total_steps and trainer.step >= total_steps:
                trainer.checkpoint("done")
                log("training finished", step=trainer.step)
                return 0
        if now >= next_checkpoint:
            trainer.checkpoint("periodic")
            next_checkpoint = now + checkpoint_every
        deadline = min(next_step, next_checkpoint, next_poll if notice_file else next_step)
        wakeup.wait(deadline - time.monotonic())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
