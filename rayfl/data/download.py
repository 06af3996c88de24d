"""Fetching a dataset file from public mirrors, atomically and checksum-verified."""

from __future__ import annotations

import http.client
import shutil
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from rayfl.data.formats import md5_file

USER_AGENT = "rayfl/0.1 (python urllib)"


class DownloadError(Exception):
    """Every mirror failed; the message lists each URL and why."""


def download(urls: Sequence[str], dest: Path, md5: str | None = None, timeout: float = 10.0) -> None:
    """Try each URL in turn and move the first good copy to `dest`. A partial or corrupt
    download never appears under the final name, so a later run does not trust it."""
    reasons = []
    part = dest.with_name(dest.name + ".part")
    for url in urls:
        try:
            request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
            with urllib.request.urlopen(request, timeout=timeout) as response, open(part, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
        except (OSError, ValueError, http.client.HTTPException) as e:
            reasons.append(f"{url}: {e}")
            part.unlink(missing_ok=True)
            continue
        if md5 is not None and (actual := md5_file(part)) != md5:
            reasons.append(f"{url}: md5 {actual} instead of {md5}")
            part.unlink(missing_ok=True)
            continue
        part.replace(dest)
        return
    raise DownloadError("; ".join(reasons) if reasons else "no URL to try")
