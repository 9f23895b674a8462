import type { Interceptor, StreamResponse, UnaryResponse } from "@connectrpc/connect";
import { authenticatedKey, rpcAuthNeed } from "./authenticate.js";
import { requestIdOf, type CallGuard, type GuardedCall } from "./call-guard.js";
import { requestIdKey } from "./context.js";

/**
 * connect-node's way through the call guard (call-guard.ts), for Connect, gRPC and gRPC-Web: the
 * request id (src/server.ts has set the header), the credentials the RPC needs ({@link
 * rpcAuthNeed}; checked before the body by src/server.ts, or now), the key's rate, and the call's
 * outcome, unary or at a stream's end, logged and counted once. Every failure, unary or
 * mid-stream, reaches the caller as the ConnectError the guard mapped it to.
 */
export function guardInterceptor(guard: CallGuard): Interceptor {
  return (next) => async (req) => {
    const requestId = requestIdOf(req.header.get("x-request-id"));
    req.contextValues.set(requestIdKey, requestId);
    const call = guard.open(`${req.service.typeName}/${req.method.name}`, {
      requestId,
      signal: req.signal,
      header: req.header,
      checked: req.contextValues.get(authenticatedKey),
      counted: { method: req.requestMethod },
    });
    let res: UnaryResponse | StreamResponse;
    try {
      const need = rpcAuthNeed(req.service.typeName, req.method.name);
      // Whatever credentials come with it: a public answer needs none, and checks none.
      if (need !== "none") await call.admit(need, req.contextValues);
      res = await next(req);
    } catch (error) {
      throw call.outcome(error);
    }
    if (!res.stream) {
      call.outcome();
      return res;
    }
    return { ...res, message: observed(res.message, call) };
  };
}

/** A stream's messages as they come, its end and its failure the call's outcome. */
function observed<T>(messages: AsyncIterable<T>, call: GuardedCall): AsyncIterable<T> {
  // An iterator rather than an async generator around the stream: one promise per message
  // instead of a generator's several.
  return {
    [Symbol.asyncIterator](): AsyncIterator<T> {
      const inner = messages[Symbol.asyncIterator]();
      const on = {
        result(result: IteratorResult<T>): IteratorResult<T> {
          if (result.done === true) call.outcome(undefined, "rpc stream ok");
          return result;
        },
        error(error: unknown): never {
          throw call.outcome(error);
        },
      };
      return {
        next() {
          return inner.next().then(on.result, on.error);
        },
        return(value?: unknown) {
          // The caller stopped reading before the end (it went away).
          call.stopped();
          if (inner.return === undefined) return Promise.resolve({ done: true, value: value as T });
          return inner.return(value).then(undefined, on.error);
        },
        throw(error?: unknown) {
          if (inner.throw === undefined) return Promise.reject(error);
          return inner.throw(error).then(undefined, on.error);
        },
      };
    },
  };
}
