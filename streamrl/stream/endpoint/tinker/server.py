"""Starting and stopping the Tinker service: the OpenAI endpoint's HTTP server
(:func:`streamrl.stream.endpoint.server.make_server`: header timeouts, header size limit,
keep-alive limit) on its own thread, a fresh token written to ``<state_dir>/tinker_token``
(mode 0600) and ``<state_dir>/tinker.json`` (``base_url``, ``token_file``).

The token starts with ``tml-``, the prefix the official client requires of an API key.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from streamrl.config.tinker import TinkerConfig
from streamrl.core.atomic import replacing
from streamrl.stream.endpoint.server import make_server
from streamrl.stream.endpoint.tinker.app import build_app
from streamrl.stream.endpoint.tinker.service import TinkerService


class TinkerServer:
    """``start()`` listens (``base_url``, ``token``); ``stop()`` ends it."""

    def __init__(self, cfg: TinkerConfig, seed: int = 0, token: str | None = None) -> None:
        self.cfg = cfg
        self.state_dir = Path(cfg.state_dir).resolve()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.token = token or "tml-" + secrets.token_urlsafe(32)
        self.service = TinkerService(cfg, self.state_dir, seed)
        self.base_url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        token_file = self.state_dir / "tinker_token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token)
        self._server = make_server(build_app(self.service, self.token), self.cfg)
        self._thread = threading.Thread(target=self._server.run, name="tinker", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OSError(
                    f"the tinker service could not listen on {self.cfg.host}:{self.cfg.port}"
                )
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://{self.cfg.host}:{port}"
        info = {"base_url": self.base_url, "token_file": str(token_file)}
        with replacing(self.state_dir / "tinker.json") as tmp:
            tmp.write_text(json.dumps(info, indent=2) + "\n")
        return self.base_url

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self.service.close()

    def __enter__(self) -> TinkerServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
