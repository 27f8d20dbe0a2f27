"""Stand-in for `python -m local_backend`: the same CLI, `/health`, a JSON chat reply.

Stdlib only so it starts in tens of milliseconds. Runs as a child of the supervisor:

    python tests/fakes/child_backend.py --model demo --host 127.0.0.1 --port 8123 [--fail]

`--fail` exits at once with status 3 (a backend that cannot start).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--threads", type=int)  # as local_backend takes it (replicas)
    args = parser.parse_args(argv)
    if args.fail:
        print("child_backend: failing on purpose", file=sys.stderr)
        return 3

    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send({"status": "ok", "model": args.model, "pid": os.getpid()})
            else:
                self.send_error(404)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(length) or b"{}")
            self._send({
                "id": "chatcmpl-child", "object": "chat.completion", "created": 0,
                "model": request.get("model"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": f"pid {os.getpid()}"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})

        def log_message(self, format: str, *log_args: object) -> None:
            pass  # quiet: the supervisor's tests read their own output

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
