import type { ConnectRouter, ServiceImpl } from "@connectrpc/connect";
import { AuditService } from "../../gen/gateway/v1/audit_pb.js";
import { CatalogService } from "../../gen/gateway/v1/catalog_pb.js";
import { GatewayService } from "../../gen/gateway/v1/gateway_pb.js";
import { InferenceService } from "../../gen/gateway/v1/inference_pb.js";
import { PermitService } from "../../gen/gateway/v1/permit_pb.js";
import { ProviderService } from "../../gen/gateway/v1/provider_pb.js";
import { QuoteService } from "../../gen/gateway/v1/quote_pb.js";
import { SettlementService } from "../../gen/gateway/v1/settlement_pb.js";
import type { DescService } from "@bufbuild/protobuf";
import type { InferenceServiceImpl } from "./inference-service.js";

/** A service and its implementation, as `router.service(service, impl)` takes them. */
export interface ServiceBinding {
  readonly service: DescService;
  // Method implementations keyed by `localName`; a missing one answers `unimplemented`.
  readonly impl: Partial<Record<string, unknown>>;
}

/**
 * The service implementations the server exposes. A service or method that is
 * not given answers Connect `unimplemented`, never made-up data.
 */
export interface Services {
  readonly catalog: ServiceImpl<typeof CatalogService>;
  readonly quote?: Partial<ServiceImpl<typeof QuoteService>>;
  /** With `chatInto`, the chat method's one body (the REST chat routes call it). */
  readonly inference?: Partial<InferenceServiceImpl>;
  readonly permit?: Partial<ServiceImpl<typeof PermitService>>;
  readonly provider?: Partial<ServiceImpl<typeof ProviderService>>;
  readonly settlement?: Partial<ServiceImpl<typeof SettlementService>>;
  /** The operator's view of the audits (the settlement operator token). */
  readonly audit?: Partial<ServiceImpl<typeof AuditService>>;
  /** Public facts (no credentials). */
  readonly gateway?: Partial<ServiceImpl<typeof GatewayService>>;
}

/** The services with their implementations, in one list (the RPC needs, the REST facade's calls). */
export function serviceBindings(services: Services): ServiceBinding[] {
  return [
    { service: CatalogService, impl: services.catalog },
    { service: QuoteService, impl: services.quote ?? {} },
    { service: InferenceService, impl: services.inference ?? {} },
    { service: PermitService, impl: services.permit ?? {} },
    { service: ProviderService, impl: services.provider ?? {} },
    { service: SettlementService, impl: services.settlement ?? {} },
    { service: AuditService, impl: services.audit ?? {} },
    { service: GatewayService, impl: services.gateway ?? {} },
  ];
}

/**
 * The largest request a payer's signed call (ListPayerAuthorizations, RevokePayerAuthorizations)
 * may send, over RPC and REST alike: they need no API key, so what an anonymous caller can make
 * the gateway read stays small. Their fields take a few hundred bytes.
 */
export const payerRequestMaxBytes = 4096;

export function createRoutes(services: Services): (router: ConnectRouter) => void {
  return (router) => {
    router.service(CatalogService, services.catalog);
    router.service(QuoteService, services.quote ?? {});
    router.service(InferenceService, services.inference ?? {});
    const permit = services.permit ?? {};
    router.service(PermitService, permit);
    // Registered again with their own body bound: the adapter keeps the last handler of a path.
    const bound = { readMaxBytes: payerRequestMaxBytes };
    if (permit.listPayerAuthorizations !== undefined)
      router.rpc(
        PermitService.method.listPayerAuthorizations,
        permit.listPayerAuthorizations.bind(permit),
        bound,
      );
    if (permit.revokePayerAuthorizations !== undefined)
      router.rpc(
        PermitService.method.revokePayerAuthorizations,
        permit.revokePayerAuthorizations.bind(permit),
        bound,
      );
    router.service(ProviderService, services.provider ?? {});
    router.service(SettlementService, services.settlement ?? {});
    router.service(AuditService, services.audit ?? {});
    router.service(GatewayService, services.gateway ?? {});
  };
}
