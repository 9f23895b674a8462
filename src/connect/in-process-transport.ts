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

  // A plain HandlerContext: connect's createHandlerContext links a new AbortController (and a
  // deadline) to the caller's signal on every call, which costs more than the rest of an
  // in-process call together. The caller's signal is the call's signal; a caller that stops
  // reading a stream ends the implementation through its generator's return().
  const contextFor = (method: DescMethod, req: UnaryRequest | StreamRequest): HandlerContext => ({
    method,
    service: method.parent,
    signal: req.signal,
    timeoutMs: () => undefined,
    requestMethod: req.requestMethod,
    requestHeader: req.header,
    responseHeader: new Headers(),
    responseTrailer: new Headers(),
    protocolName: "in-process",
    values: req.contextValues,
    url: req.url,
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
        // Stopping early (return()) ends `outputs` too: for-await returns its iterator.
        for await (const m of outputs)
          yield create(method.output, m as MessageInitShape<DescMessage>);
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
