"""POSTing pre-encoded ops to a node the way the benchmarks do: retried while the node answers
503 (its write queue is full). A module of its own: the writer processes import it without the
benchmarks' heavier imports (libp2p)."""

from __future__ import annotations

import time

import httpx


class Poster:
    """POSTs pre-encoded ops; waits and retries while the node answers 503 (write queue full)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(timeout=60)
        self.busy = 0  # 503 answers
        self.errors = 0

    def post(self, fragments: list[str]) -> bool:
        """POST the ops (``{"kind","data"}`` JSON fragments); True once the node took them."""
        body = ('{"ops":[' + ",".join(fragments) + "]}").encode()
        for attempt in range(2000):
            try:
                response = self.http.post(
                    f"{self.url}/ops", content=body, headers={"content-type": "application/json"}
                )
            except httpx.HTTPError:
                self.errors += 1
                time.sleep(0.1)
                continue
            if response.status_code == 201:
                return True
            if response.status_code == 503:
                self.busy += 1
                time.sleep(min(0.2, 0.005 * (attempt + 1)))
                continue
            self.errors += 1
            return False
        return False

    def close(self) -> None:
        self.http.close()
