import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import type { Address } from "viem";
import type { AuditCorpusSource } from "../domain/audits/types.js";
import {
  AuditCorpus,
  GatewayService,
  GetGatewayResponseSchema,
} from "../../gen/gateway/v1/gateway_pb.js";

export interface GatewayFacts {
  /** This database's deployment id: named in every payer's AuthorizeKey signature. */
  readonly deployment: string;
  readonly chainId: number;
  readonly market: Address;
  /** The settlement operator account (SETTLEMENT_PRIVATE_KEY's address); absent: none. */
  readonly settlementAccount: Address | undefined;
  /** The receipt key's address (RECEIPT_PRIVATE_KEY's); absent: no receipts. */
  readonly receiptSigner: Address | undefined;
  /** The corpus the blind audits ask; absent: no audits. */
  readonly auditCorpus?: AuditCorpusSource | undefined;
}

const corpusOf = {
  shipped: AuditCorpus.SHIPPED,
  operator: AuditCorpus.OPERATOR,
} as const;

/**
 * GatewayService: public facts, no credentials (the auth interceptor lets this service through).
 * The answer is made once, at start: an unauthenticated call reads memory and nothing else
 * (DESIGN.md section 8).
 */
export function createGatewayService(facts: GatewayFacts): ServiceImpl<typeof GatewayService> {
  const answer = create(GetGatewayResponseSchema, {
    gateway: {
      chainId: BigInt(facts.chainId),
      market: facts.market,
      settlementAccount: facts.settlementAccount ?? "",
      receiptSigner: facts.receiptSigner ?? "",
      deployment: facts.deployment,
      auditCorpus:
        facts.auditCorpus === undefined ? AuditCorpus.UNSPECIFIED : corpusOf[facts.auditCorpus],
    },
  });
  return {
    getGateway() {
      return answer;
    },
  };
}
