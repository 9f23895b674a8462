import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import {
  authInterceptor,
  newRequestId,
  observabilityInterceptor,
  type AuthOptions,
} from "./connect/interceptors.js";
import { createInProcessCaller } from "./connect/in-process-transport.js";
import { createRoutes, serviceBindings, type Services } from "./connect/routes.js";
import type { NodeRequest } from "./rest/body.js";
import { createRestFacade, type NodeResponse, type Readiness } from "./rest/facade.js";

export interface GatewayHandlerDeps extends AuthOptions {
  readonly services: Services;
  readonly logger: Logger;
  readonly bodyLimitBytes: number;
  readonly readiness: () => Promise<Readiness>;
}

const requestIdPattern = /^[A-Za-z0-9._-]{1,128}$/;

/**
 * One request handler for everything: Connect, gRPC and gRPC-Web for the RPC
 * paths, and the REST facade (connect-node's fallback) for the rest. The
 * facade reaches the same implementations in process (no serialisation) through
 * the same interceptors, so authentication, logging and error mapping exist once.
 */
export function createGatewayHandler(
  deps: GatewayHandlerDeps,
): (req: NodeRequest, res: NodeResponse) => void {
  const interceptors = [observabilityInterceptor(deps.logger), authInterceptor(deps)];
  const routes = createRoutes(deps.services);
  const rpc = createInProcessCaller(serviceBindings(deps.services), interceptors);
  const facade = createRestFacade({
    rpc,
    bodyLimitBytes: deps.bodyLimitBytes,
    readiness: deps.readiness,
    logger: deps.logger,
  });
  const connect = connectNodeAdapter({
    routes,
    interceptors,
    readMaxBytes: deps.bodyLimitBytes + 1024,
    fallback: facade,
  });
  return (req, res) => {
    const incoming = req.headers["x-request-id"];
    const requestId =
      typeof incoming === "string" && requestIdPattern.test(incoming) ? incoming : newRequestId();
    req.headers["x-request-id"] = requestId;
    res.setHeader("x-request-id", requestId);
    connect(req, res);
  };
}
