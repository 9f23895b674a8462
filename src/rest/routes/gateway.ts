import { GatewayService } from "../../../gen/gateway/v1/gateway_pb.js";
import { gatewayResource } from "../views/receipts.js";
import type { Route } from "../route-kit.js";

/** The GatewayService route: the gateway's public facts. */

export const gatewayRoutes: readonly Route[] = [
  {
    method: "GET",
    path: "/v1/gateway",
    operationId: "getGateway",
    summary: "This gateway's public facts (no credentials)",
    description:
      "The chain and market it serves, its settlement account and the address that signs its usage receipts (null when it has no receipt key). Answered from memory.",
    tag: "operations",
    auth: "none",
    answer: { description: "The gateway", schema: gatewayResource.schema },
    handle: async ({ unary }) => {
      const { gateway } = await unary(GatewayService.method.getGateway, {});
      if (gateway === undefined) throw new Error("GetGateway answered without the facts");
      return { body: gatewayResource.view(gateway) };
    },
  },
];
