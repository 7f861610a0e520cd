"""The static files storage: WhiteNoise's compressed files, compressed again only when changed.

`make run` collects the static files at every start (demo_setup --prepare), and WhiteNoise
compresses every collected file each time: ~1.5 CPU-s of gzip over the admin's and the API
docs' unchanged bundles. WhiteNoise gives a compressed copy its source's modification time, so
a copy with the source's time is the current one; a changed source (collectstatic copies it
anew) is compressed again.
"""
from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from whitenoise.storage import CompressedStaticFilesStorage  # type: ignore[import-untyped]


class CompressedOnceStaticFilesStorage(CompressedStaticFilesStorage):
    def post_process(self, paths: dict[str, Any], dry_run: bool = False, **options: Any) -> Any:
        compressor = self.create_compressor(
            extensions=getattr(settings, "WHITENOISE_SKIP_COMPRESS_EXTENSIONS", None), quiet=True)
        suffixes = [s for s, used in ((".br", compressor.use_brotli), (".gz", compressor.use_gzip)) if used]
        changed = {name: value for name, value in paths.items() if not self._compressed(name, suffixes)}
        yield from super().post_process(changed, dry_run=dry_run, **options)

    def _compressed(self, name: str, suffixes: list[str]) -> bool:
        """Whether every compressed copy of `name` carries its source's modification time."""
        source = self.path(name)
        try:
            mtime = os.stat(source).st_mtime
            return bool(suffixes) and all(os.stat(source + s).st_mtime == mtime for s in suffixes)
        except FileNotFoundError:
            return False
