#!/usr/bin/env bash
# CI step (issue 8.8): a production install — requirements.txt alone, no dev file — must run
# Celery: build a fresh venv in a temporary directory (pip's download cache keeps it quick),
# migrate a scratch SQLite database, run a worker and beat against Redis for a few seconds,
# and require that a liveness sweep actually ran (its SweepRun row). A dev install hides a
# missing transport dependency (kombu.transport.redis needs `packaging`; pytest brings it).
#
#   bash scripts/check_prod_install.sh        (REDIS_URL defaults to redis://127.0.0.1:6379/0)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
REQUIREMENTS="${REQUIREMENTS:-requirements.txt}"
WORK="$(mktemp -d -t rsc-prod-install-XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== production install check: fresh venv from requirements.txt only ($WORK)"
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --disable-pip-version-check -r "$REQUIREMENTS"
VPY="$WORK/venv/bin/python"
"$VPY" -c "import kombu.transport.redis"  # what a dev install hid (issue 8.8)

export DJANGO_SETTINGS_MODULE=coordinator_project.settings
export SECRET_KEY="prod-install-check"
unset DATABASE_URL DEBUG
export SQLITE_PATH="$WORK/check.sqlite3"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
export CELERY_QUEUE="rsc-prod-install-check-$$"   # nobody else consumes or publishes here
export SWEEP_INTERVAL_SECONDS=0.5
"$VPY" manage.py migrate --noinput -v0

"$WORK/venv/bin/celery" -A coordinator_project worker --loglevel=INFO --concurrency=1 --pool=solo \
  --without-gossip --without-mingle >"$WORK/worker.log" 2>&1 &
pids+=($!)
"$WORK/venv/bin/celery" -A coordinator_project beat --loglevel=INFO --schedule "$WORK/beat-schedule" \
  >"$WORK/beat.log" 2>&1 &
pids+=($!)

ran() {
  "$VPY" manage.py shell --no-imports -c "
from groups.models import SweepRun
import sys
sys.exit(0 if SweepRun.objects.filter(name='liveness', last_finished_at__isnull=False).exists() else 1)"
}
for _ in $(seq 60); do
  if ran; then
    echo "   a liveness sweep ran from the production install (worker + beat on $REDIS_URL)"
    exit 0
  fi
  sleep 0.5
done
echo "no sweep ran from the production install; worker log:" >&2
tail -40 "$WORK/worker.log" >&2
echo "beat log:" >&2
tail -20 "$WORK/beat.log" >&2
exit 1
