#!/usr/bin/env bash
# `make run`: the whole system on this machine — coordinator (gunicorn), Celery worker and
# beat, and a demo producer with two demo members from the data-plane library.
# SQLite is the embedded default when DATABASE_URL is unset. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export DJANGO_SETTINGS_MODULE=coordinator_project.settings
export DEBUG="${DEBUG:-1}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"
export PORT="${PORT:-8000}"
URL="http://127.0.0.1:${PORT}"
mkdir -p var

redis_host_port() { "$PY" -c "import sys,urllib.parse as u; p=u.urlparse(sys.argv[1]); print(p.hostname or '127.0.0.1', p.port or 6379)" "$REDIS_URL"; }
read -r RHOST RPORT < <(redis_host_port)
if ! "$PY" -c "import redis,sys; redis.Redis.from_url(sys.argv[1], socket_timeout=1).ping()" "$REDIS_URL" 2>/dev/null; then
  if command -v redis-server >/dev/null && [ "$RHOST" = "127.0.0.1" ]; then
    echo "starting a local Redis on port $RPORT"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$RPORT" --save "" --appendonly no >/dev/null
  else
    echo "Redis at $REDIS_URL is not reachable: start one or set REDIS_URL" >&2; exit 1
  fi
fi

echo "== database: ${DATABASE_URL:-SQLite at var/coordinator.sqlite3}"
"$PY" manage.py migrate --noinput -v0
"$PY" manage.py collectstatic --noinput -v0
eval "$("$PY" manage.py demo_setup)"

pids=()       # coordinator, worker, beat
demo_pids=()  # members and producer: stopped first, so members can still leave (-1)
cleanup() {
  trap - INT TERM EXIT
  echo; echo "== stopping"
  for pid in "${demo_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${demo_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

# The coordinator, worker and beat run in their own session: a terminal Ctrl-C reaches only
# the members and the producer, which leave the group while the coordinator still answers.
setsid .venv/bin/gunicorn -c coordinator_project/gunicorn.conf.py coordinator_project.wsgi -b "127.0.0.1:${PORT}" &
pids+=($!)
setsid .venv/bin/celery -A coordinator_project worker --loglevel=INFO --concurrency=1 --without-gossip --without-mingle &
pids+=($!)
setsid .venv/bin/celery -A coordinator_project beat --loglevel=INFO --schedule var/celerybeat-schedule &
pids+=($!)

for _ in $(seq 100); do
  "$PY" -c "import httpx,sys; sys.exit(httpx.get(sys.argv[1], timeout=1).status_code != 200)" "$URL/readyz" 2>/dev/null && break
  sleep 0.2
done

DEMO_MEMBER=demo-1 "$PY" -m dataplane consume --coordinator "$URL" --group "$DEMO_GROUP" --api-key "$DEMO_GROUP_KEY" \
  --redis "$REDIS_URL" --handler demo.handler:handle --member-id demo-1 -v &
demo_pids+=($!)
DEMO_MEMBER=demo-2 "$PY" -m dataplane consume --coordinator "$URL" --group "$DEMO_GROUP" --api-key "$DEMO_GROUP_KEY" \
  --redis "$REDIS_URL" --handler demo.handler:handle --member-id demo-2 -v &
demo_pids+=($!)
"$PY" -m demo.producer --coordinator "$URL" --stream "$DEMO_STREAM" --api-key "$DEMO_STREAM_KEY" --redis "$REDIS_URL" &
demo_pids+=($!)

cat <<INFO

== Redis Stream Coordinator is running
   admin:     $URL/admin/   (user: $DEMO_ADMIN_USER  password: $DEMO_ADMIN_PASSWORD)
   API docs:  $URL/api/docs/      metrics: $URL/metrics
   describe:  curl -H 'Authorization: Bearer $DEMO_GROUP_KEY' $URL/api/v1/groups/$DEMO_GROUP
   group key: $DEMO_GROUP_KEY
   stream key (producers, reshard): $DEMO_STREAM_KEY
   try:       .venv/bin/python manage.py reshard $DEMO_STREAM --shards 6   (then watch the admin)
   Ctrl-C stops everything.

INFO
wait -n "${pids[@]}" "${demo_pids[@]}" || true
echo "a process exited; stopping the rest" >&2
