import {
  create,
  type DescMessage,
  type DescMethod,
  type DescMethodUnary,
  type DescService,
  type MessageInitShape,
  type MessageShape,
} from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createContextValues,
  type ContextValues,
  type HandlerContext,
  type Interceptor,
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
type UnaryFn = (req: UnaryRequest) => Promise<UnaryResponse>;

const noTimeout = (): undefined => undefined;

/** Request headers as Node has them: lower-case names, repeated headers as arrays. */
export type HeaderRecord = Readonly<Record<string, string | string[] | undefined>>;

/** What a caller hands an in-process call besides its input. */
export interface InProcessCallOptions {
  /** The call's signal: aborting it cancels the call (the REST client went away). */
  readonly signal: AbortSignal;
  /** The caller's request headers (credentials, request id), read in place. */
  readonly headers: HeaderRecord;
  /** Values the interceptors and the implementation share; fresh ones when absent. */
  readonly contextValues?: ContextValues;
}

/**
 * Calls the service implementations of this process. The REST facade's way to the RPCs: one
 * call per HTTP request, with the input as a message object, never serialised.
 */
export interface InProcessCaller {
  unary<I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    input: MessageInitShape<I>,
    options: InProcessCallOptions,
  ): Promise<MessageShape<O>>;
}

/**
 * The caller's headers as a `Headers`, read in place: copying them into a WHATWG `Headers`
 * costs more than everything else an in-process call does before its implementation runs.
 * A write (an interceptor adding a header) first copies them, so the caller's are never changed.
 */
class HeaderView implements Headers {
  private copy: Headers | undefined;

  constructor(private readonly source: HeaderRecord) {}

  private own(): Headers {
    if (this.copy === undefined) {
      this.copy = new Headers();
      for (const [name, value] of Object.entries(this.source)) {
        if (name.startsWith(":")) continue; // HTTP/2 pseudo-headers are not headers
        if (typeof value === "string") this.copy.append(name, value);
        else if (Array.isArray(value)) for (const v of value) this.copy.append(name, v);
      }
    }
    return this.copy;
  }

  get(name: string): string | null {
    if (this.copy !== undefined) return this.copy.get(name);
    const value = this.source[name.toLowerCase()];
    if (value === undefined) return null;
    return typeof value === "string" ? value : value.join(", ");
  }

  has(name: string): boolean {
    return this.get(name) !== null;
  }

  getSetCookie(): string[] {
    return this.own().getSetCookie();
  }

  set(name: string, value: string): void {
    this.own().set(name, value);
  }

  append(name: string, value: string): void {
    this.own().append(name, value);
  }

  delete(name: string): void {
    this.own().delete(name);
  }

  forEach(
    callback: (value: string, key: string, parent: Headers) => void,
    thisArg?: unknown,
  ): void {
    this.own().forEach((value, key) => callback.call(thisArg, value, key, this));
  }

  entries(): ReturnType<Headers["entries"]> {
    return this.own().entries();
  }

  keys(): ReturnType<Headers["keys"]> {
    return this.own().keys();
  }

  values(): ReturnType<Headers["values"]> {
    return this.own().values();
  }

  [Symbol.iterator](): ReturnType<Headers["entries"]> {
    return this.own().entries();
  }
}

/**
 * Calls the service implementations in this process directly: the request and
 * response messages are passed as objects, never serialised, while the call still goes through
 * the given interceptors (the server's, so authentication, logging and error mapping are the
 * same code as on the network) and the implementation gets a real HandlerContext.
 *
 * It is not a connect `Transport` under a `createClient` client: those two layers exist to turn
 * calls into the protocol and back, which an in-process call does not do. Unary methods only:
 * the one server-streaming method, the chat, is called by the REST facade without an RPC (the
 * chat handler's push entry through the call guard, src/rest/chat.ts and src/server.ts).
 */
export function createInProcessCaller(
  bindings: readonly ServiceBinding[],
  interceptors: readonly Interceptor[],
): InProcessCaller {
  const impls = new Map<DescMethod, unknown>();
  for (const { service, impl } of bindings) {
    for (const method of service.methods) impls.set(method, impl[method.localName]);
  }

  // A plain HandlerContext: connect's createHandlerContext links a new AbortController (and a
  // deadline) to the caller's signal on every call, which costs more than the rest of an
  // in-process call together. The caller's signal is the call's signal; a caller that stops
  // reading a stream ends the implementation through its generator's return().
  const contextFor = (method: DescMethod, req: UnaryRequest): HandlerContext => ({
    method,
    service: method.parent,
    signal: req.signal,
    timeoutMs: noTimeout,
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

  const innermost = async (req: UnaryRequest): Promise<UnaryResponse> => {
    const method = req.method;
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
  };

  // The interceptors are the server's (unary and streaming); an in-process call is unary.
  let call: UnaryFn = innermost;
  for (const interceptor of [...interceptors].reverse())
    call = interceptor(call as never) as unknown as UnaryFn;

  const urlOf = (method: DescMethod) => `in-process:///${method.parent.typeName}/${method.name}`;

  return {
    async unary<I extends DescMessage, O extends DescMessage>(
      method: DescMethodUnary<I, O>,
      input: MessageInitShape<I>,
      options: InProcessCallOptions,
    ): Promise<MessageShape<O>> {
      const req: UnaryRequest<I, O> = {
        stream: false,
        service: method.parent,
        method,
        requestMethod: "POST",
        url: urlOf(method),
        signal: options.signal,
        header: new HeaderView(options.headers),
        contextValues: options.contextValues ?? createContextValues(),
        message: create(method.input, input),
      };
      const res = (await call(req as unknown as UnaryRequest)) as unknown as UnaryResponse<I, O>;
      return res.message;
    },
  };
}
