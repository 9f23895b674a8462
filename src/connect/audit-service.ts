import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import {
  AuditService,
  AuditTest,
  ListAuditStandingsResponseSchema,
} from "../../gen/gateway/v1/audit_pb.js";
import { decimalString, type AuditStandingStore } from "../domain/audits/standing.js";
import type { AuditTestName } from "../domain/audits/types.js";
import { GatewayError } from "../domain/errors.js";
import { isHex32 } from "../domain/hex.js";
import { auditToMessage } from "./convert.js";

const testToProto: Record<AuditTestName, AuditTest> = {
  border_probe: AuditTest.BORDER_PROBE,
  mmd: AuditTest.MMD,
  logprob: AuditTest.LOGPROB,
};

/**
 * The operator's view of the audits (docs/decisions/audits.md): every offer's standing with the
 * evidence it rests on, read from the database when asked (`read`: the standings every process
 * routes by). The operator token is checked by the auth interceptor before the call.
 */
export function createAuditService(
  deps: Pick<AuditStandingStore, "read">,
): ServiceImpl<typeof AuditService> {
  return {
    async listAuditStandings(req) {
      const modelId = req.modelId.toLowerCase();
      if (modelId !== "" && !isHex32(modelId))
        throw new GatewayError("invalid_request", "model_id must be a 32-byte hex ModelID");
      const standings = [...(await deps.read()).values()]
        .filter((s) => modelId === "" || s.modelId === modelId)
        .sort((a, b) =>
          a.modelId === b.modelId
            ? a.offerId.localeCompare(b.offerId)
            : a.modelId.localeCompare(b.modelId),
        );
      return create(ListAuditStandingsResponseSchema, {
        standings: standings.map((s) => ({
          offerId: s.offerId,
          modelId: s.modelId,
          audit: auditToMessage(s),
          referenceOfferId: s.reference.offerId ?? "",
          clearedAt:
            s.clearedAtMs === undefined ? undefined : BigInt(Math.floor(s.clearedAtMs / 1000)),
          tests: s.tests.map((t) => ({
            test: testToProto[t.test],
            samples: t.samples,
            referenceSamples: t.referenceSamples,
            statistic: decimalString(t.statistic),
            pValue: t.pValue === undefined ? undefined : decimalString(t.pValue),
            eValue: decimalString(t.eValue),
          })),
        })),
      });
    },
  };
}
