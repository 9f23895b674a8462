import {
  create,
  type DescMessage,
  type DescMethod,
  type DescMethodUnary,
  type MessageInitShape,
  type MessageShape,
} from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues, type HandlerContext } from "@connectrpc/connect";
import { rpcAuthNeed } from "./authenticate.js";
import { handlerContext, type CallGuard, type CallRequest } from "./call-guard.js";
import { serviceBindings, type Services } from "./routes.js";

/**
 * A unary service method called directly, as the REST facade's routes call them: the call guard
 * (the method's credentials, the key's rate, the outcome logged and counted once under the RPC's
 * name), then the method itself with the guard's context. The input and output are message
 * objects, never serialised; no transport and no interceptor chain in between.
 */
export type UnaryCall = <I extends DescMessage, O extends DescMessage>(
  method: DescMethodUnary<I, O>,
  input: MessageInitShape<I>,
) => Promise<MessageShape<O>>;

type UnaryImpl = (req: unknown, ctx: HandlerContext) => unknown;

/** The direct unary calls of `services`, for one request at a time (`unaryFor`). */
export function createServiceCalls(
  services: Services,
  guard: CallGuard,
): (request: CallRequest) => UnaryCall {
  const impls = new Map<DescMethod, unknown>();
  for (const { service, impl } of serviceBindings(services)) {
    for (const method of service.methods) impls.set(method, impl[method.localName]);
  }
  return (request) =>
    async <I extends DescMessage, O extends DescMessage>(
      method: DescMethodUnary<I, O>,
      input: MessageInitShape<I>,
    ): Promise<MessageShape<O>> => {
      const call = guard.open(`${method.parent.typeName}/${method.name}`, request);
      try {
        const values = createContextValues();
        const need = rpcAuthNeed(method.parent.typeName, method.name);
        if (need !== "none") await call.admit(need, values);
        const impl = impls.get(method);
        if (typeof impl !== "function") {
          throw new ConnectError(
            `${method.parent.typeName}.${method.name} is not implemented`,
            Code.Unimplemented,
          );
        }
        const ctx = handlerContext(method, call, request.header, values);
        const output = await (impl as UnaryImpl)(create(method.input, input), ctx);
        const message = create(method.output, output as MessageInitShape<O>);
        call.outcome();
        return message;
      } catch (error) {
        throw call.outcome(error);
      }
    };
}
