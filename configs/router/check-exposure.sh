#!/bin/sh
# The router's exposure rule, run before nginx starts (compose.yaml's entrypoint): it
# binds ROUTER_BIND_ADDRESS (BIND_ADDRESS), and beyond loopback only when VLLM_API_KEY is
# set or DEEPINFER_ALLOW_UNAUTHENTICATED=1 says serving without a key is meant.
# Exit 2: refused (a configuration to fix, not a crash to retry). Otherwise exec "$@".
addr="${ROUTER_BIND_ADDRESS:-127.0.0.1}"
allow="${DEEPINFER_ALLOW_UNAUTHENTICATED:-0}"
case "$allow" in
  0|1) ;;
  *) echo "error: router: DEEPINFER_ALLOW_UNAUTHENTICATED='$allow': use 1 (allow) or 0 (refuse, the default)" >&2
     exit 2 ;;
esac
case "$addr" in
  127.*|localhost|::1|'[::1]') loopback=1 ;;
  *) loopback=0 ;;
esac
if [ "$loopback" = 0 ] && [ -z "${VLLM_API_KEY:-}" ] && [ "$allow" != 1 ]; then
  echo "error: router: refused: it would listen on $addr without an API key: set VLLM_API_KEY" \
       "(the replicas check the key it passes on), keep BIND_ADDRESS on 127.0.0.1, or set" \
       "DEEPINFER_ALLOW_UNAUTHENTICATED=1 to serve without authentication on purpose" >&2
  exit 2
fi
exec "$@"
