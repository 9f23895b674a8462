import {
  create,
  type DescMessage,
  type DescMethod,
  type DescMethodStreaming,
  type DescMethodUnary,
  type DescService,
  type MessageInitShape,
} from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createContextValues,
  createHandlerContext,
  type ContextValues,
  type HandlerContext,
  type Interceptor,
  type StreamRequest,
  type StreamResponse,
  type Transport,
  type UnaryRequest,
  type UnaryResponse,
} from "@connectrpc/connect";

/** A service and its implementation, as `router.service(service, impl)` takes them. */
export interface ServiceBinding {
  readonly service: DescService;
  // Method implementations keyed by `localName`; a missing one answers `unimplemented`.
  readonly impl: Partial<Record<string, unknown>>;
}

type UnaryImpl = (req: unknown, ctx: HandlerContext) => unknown;
type StreamImpl = (req: unknown, ctx: HandlerContext) => AsyncIterable<unknown>;
type AnyFn = (req: UnaryRequest | StreamRequest) => Promise<UnaryResponse | StreamResponse>;

const neverAborted = new AbortController().signal;

/**
 * A Transport that calls the service implementations in this process directly: the request
 * and response messages are passed as objects, never serialised, while the call still goes
 * through the given interceptors (the server's, so authentication, logging and error mapping
 * are the same code as on the network) and the implementation gets a real HandlerContext.
 *
 * connect's own `createRouterTransport` runs the full protocol in memory (serialise, envelope,
 * parse, per-call signal plumbing); for the REST facade, which calls an RPC per HTTP request,
 * that is most of its cost. Unary and server-streaming methods are supported, which is what
 * the gateway's services define.
 */
export function createInProcessTransport(
  bindings: readonly ServiceBinding[],
  interceptors: readonly Interceptor[],
): Transport {
  const impls = new Map<DescMethod, unknown>();
  for (const { service, impl } of bindings) {
    for (const method of service.methods) impls.set(method, impl[method.localName]);
  }

  const contextFor = (
    method: DescMethod,
    req: UnaryRequest | StreamRequest,
  ): ReturnType<typeof createHandlerContext> =>
    createHandlerContext({
      service: method.parent,
      method,
      protocolName: "in-process",
      requestMethod: req.requestMethod,
      url: req.url,
      requestSignal: req.signal,
      requestHeader: req.header,
      contextValues: req.contextValues,
    });

  const implOf = <T>(method: DescMethod): T => {
    const impl = impls.get(method);
    if (typeof impl !== "function") {
      throw new ConnectError(
        `${method.parent.typeName}.${method.name} is not implemented`,
        Code.Unimplemented,
      );
    }
    return impl as T;
  };

  const innermost: AnyFn = async (req) => {
    const method = req.method;
    if (!req.stream) {
      const impl = implOf<UnaryImpl>(method);
      const ctx = contextFor(method, req);
      const output = await impl(req.message, ctx);
      return {
        stream: false,
        service: method.parent,
        method: method as DescMethodUnary,
        header: ctx.responseHeader,
        trailer: ctx.responseTrailer,
        message: create(method.output, output as MessageInitShape<DescMessage>),
      };
    }
    const impl = implOf<StreamImpl>(method);
    const ctx = contextFor(method, req);
    // Server streaming: the one request message, then the implementation's messages as they come.
    let input: unknown;
    for await (const m of req.message) input = m;
    const outputs = impl(input, ctx);
    return {
      stream: true,
      service: method.parent,
      method: method as DescMethodStreaming,
      header: ctx.responseHeader,
      trailer: ctx.responseTrailer,
      message: (async function* () {
        let done = false;
        try {
          for await (const m of outputs)
            yield create(method.output, m as MessageInitShape<DescMessage>);
          done = true;
        } finally {
          // A consumer that stops early cancels the call, as a network client's reset would.
          if (!done) ctx.abort(new ConnectError("the caller stopped reading", Code.Canceled));
        }
      })(),
    };
  };

  let call = innermost;
  for (const interceptor of [...interceptors].reverse()) call = interceptor(call as never) as AnyFn;

  const common = (
    method: DescMethod,
    signal: AbortSignal | undefined,
    header: ConstructorParameters<typeof Headers>[0] | undefined,
    contextValues: ContextValues | undefined,
  ) => ({
    service: method.parent,
    requestMethod: "POST",
    url: `in-process:///${method.parent.typeName}/${method.name}`,
    signal: signal ?? neverAborted,
    header: new Headers(header),
    contextValues: contextValues ?? createContextValues(),
  });

  return {
    async unary<I extends DescMessage, O extends DescMessage>(
      method: DescMethodUnary<I, O>,
      signal: AbortSignal | undefined,
      _timeoutMs: number | undefined,
      header: ConstructorParameters<typeof Headers>[0] | undefined,
      input: MessageInitShape<I>,
      contextValues?: ContextValues,
    ): Promise<UnaryResponse<I, O>> {
      const req: UnaryRequest<I, O> = {
        ...common(method, signal, header, contextValues),
        stream: false,
        method,
        message: create(method.input, input),
      };
      return (await call(req as unknown as UnaryRequest)) as unknown as UnaryResponse<I, O>;
    },
    async stream<I extends DescMessage, O extends DescMessage>(
      method: DescMethodStreaming<I, O>,
      signal: AbortSignal | undefined,
      _timeoutMs: number | undefined,
      header: ConstructorParameters<typeof Headers>[0] | undefined,
      input: AsyncIterable<MessageInitShape<I>>,
      contextValues?: ContextValues,
    ): Promise<StreamResponse<I, O>> {
      const req: StreamRequest<I, O> = {
        ...common(method, signal, header, contextValues),
        stream: true,
        method,
        message: (async function* () {
          for await (const m of input) yield create(method.input, m);
        })(),
      };
      return (await call(req as unknown as StreamRequest)) as unknown as StreamResponse<I, O>;
    },
  };
}
