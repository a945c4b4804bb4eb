#!/bin/sh
# Runs one LiteLLaMA service in a container with the settings of deploy/litellama.env (passed as
# environment variables). Usage: litellama-service scheduler|worker|tokenizer|vision [extra flags]
set -eu
service="${1:-scheduler}"
[ $# -gt 0 ] && shift
: "${LITELLAMA_MODEL_DIR:=/opt/litellama/share/litellama/models/default}"
: "${LITELLAMA_DEVICE:=cpu}"
: "${LITELLAMA_DTYPE:=auto}"
: "${LITELLAMA_CLIENT_ENDPOINT:=ipc:///run/litellama/client.sock}"
: "${LITELLAMA_WORKER_ENDPOINT:=ipc:///run/litellama/worker.sock}"
: "${LITELLAMA_TOKENIZER_ENDPOINT:=ipc:///run/litellama/tokenizer.sock}"
: "${LITELLAMA_VISION_ENDPOINT:=ipc:///run/litellama/vision.sock}"
: "${LITELLAMA_VISION_POOL_BYTES:=268435456}"
: "${LITELLAMA_MAX_IMAGE_BYTES:=20971520}"
: "${LITELLAMA_METRICS_HOST:=0.0.0.0}"
: "${LITELLAMA_METRICS_PORT:=9400}"
: "${LITELLAMA_MAX_BATCH_TOKENS:=2048}"
: "${LITELLAMA_MAX_BATCH_SEQS:=128}"
: "${LITELLAMA_KV_SLOTS:=0}"
: "${LITELLAMA_THREADS:=0}"
: "${LITELLAMA_HEARTBEAT_MS:=200}"
: "${LITELLAMA_PEER_TIMEOUT_MS:=2000}"
: "${LITELLAMA_LOG_LEVEL:=info}"
# Each container has its own network namespace, so every service can use the same port.
metrics="${LITELLAMA_METRICS_HOST}:${LITELLAMA_METRICS_PORT}"
# Flags every service takes, placed after the service's own.
set -- --heartbeat-ms "$LITELLAMA_HEARTBEAT_MS" --peer-timeout-ms "$LITELLAMA_PEER_TIMEOUT_MS" \
  --log-level "$LITELLAMA_LOG_LEVEL" "$@"
case "$service" in
  scheduler)
    exec litellama-scheduler --client-endpoint "$LITELLAMA_CLIENT_ENDPOINT" \
      --worker-endpoint "$LITELLAMA_WORKER_ENDPOINT" \
      --tokenizer-endpoint "$LITELLAMA_TOKENIZER_ENDPOINT" \
      --vision-endpoint "$LITELLAMA_VISION_ENDPOINT" --max-image-bytes "$LITELLAMA_MAX_IMAGE_BYTES" \
      --metrics "$metrics" \
      --max-batch-tokens "$LITELLAMA_MAX_BATCH_TOKENS" --max-batch-seqs "$LITELLAMA_MAX_BATCH_SEQS" \
      "$@" ;;
  worker)
    exec litellama-worker --model "$LITELLAMA_MODEL_DIR" --device "$LITELLAMA_DEVICE" \
      --dtype "$LITELLAMA_DTYPE" \
      --scheduler "$LITELLAMA_WORKER_ENDPOINT" --metrics "$metrics" \
      --kv-slots "$LITELLAMA_KV_SLOTS" --threads "$LITELLAMA_THREADS" \
      --max-batch-tokens "$LITELLAMA_MAX_BATCH_TOKENS" --max-batch-seqs "$LITELLAMA_MAX_BATCH_SEQS" \
      "$@" ;;
  tokenizer)
    exec litellama-tokenizer --model "$LITELLAMA_MODEL_DIR" \
      --scheduler "$LITELLAMA_TOKENIZER_ENDPOINT" --metrics "$metrics" "$@" ;;
  vision)
    exec litellama-vision --model "$LITELLAMA_MODEL_DIR" --scheduler "$LITELLAMA_VISION_ENDPOINT" \
      --metrics "$metrics" --vision-pool-bytes "$LITELLAMA_VISION_POOL_BYTES" \
      --max-image-bytes "$LITELLAMA_MAX_IMAGE_BYTES" "$@" ;;
  *)
    echo "litellama-service: unknown service '$service' (scheduler, worker, tokenizer or vision)" >&2
    exit 2 ;;
esac
