import { parseArgs } from "node:util";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { toJson } from "@bufbuild/protobuf";
import {
  AuditService,
  AuditTest,
  ListAuditStandingsResponseSchema,
  type AuditStanding,
} from "../../gen/gateway/v1/audit_pb.js";
import { AuditReferenceKind, AuditState } from "../../gen/gateway/v1/market_pb.js";
import { describeRpcFailure, operatorAuth } from "../clients/settlement.js";
import { ConfigError, parseSettleConfig } from "../config.js";
import { BaseError } from "../domain/base-error.js";
import { isHex32 } from "../domain/hex.js";

export const auditsUsage = `usage: gateway audits [--model MODEL_ID] [--json]

  Every offer the market's audits judged, with its evidence: the state (unaudited, passing,
  flagged, excluded), the e-value against the thresholds that flag and exclude, the reference,
  and per test the samples, statistic, p-value and e-value. Asked of the gateway over gRPC with
  the operator token (AuditService.ListAuditStandings; GET /audits/standings over REST).

  --model MODEL_ID   only this model's offers (its Hex32 ModelID)
  --json             the answer as protobuf JSON

Gateway:  GATEWAY_URL (default http://127.0.0.1:8080), SETTLEMENT_OPERATOR_TOKEN (required)

usage: gateway audits export-reference --model MODEL [--out DIR]

  Writes the model's reference data from its anchor's audit samples (AUDIT_ANCHORS), read from
  the database (DATABASE_URL): borders/<ModelID>.json (the near-ties found on the anchor) and
  reference/<ModelID>.json (the median logprob score per sequence), and prints each file's
  SHA-256 and the manifest lines that pin it.

  --model MODEL      the model's ModelID, or its public id from CATALOG_FILE
  --out DIR          the folder the files go to (default: the current folder)`;

export class AuditsUsageError extends BaseError {
  override readonly name = "AuditsUsageError";
  readonly reason = "usage";
}

export interface AuditsIo {
  out(line: string): void;
  error(line: string): void;
}

const stateWords: Record<AuditState, string> = {
  [AuditState.UNSPECIFIED]: "unknown",
  [AuditState.UNAUDITED]: "unaudited",
  [AuditState.PASSING]: "passing",
  [AuditState.FLAGGED]: "flagged",
  [AuditState.EXCLUDED]: "excluded",
};

const referenceWords: Record<AuditReferenceKind, string> = {
  [AuditReferenceKind.UNSPECIFIED]: "none",
  [AuditReferenceKind.ANCHOR]: "anchor",
  [AuditReferenceKind.MAJORITY]: "majority",
  [AuditReferenceKind.DATA]: "data",
};

const testWords: Record<AuditTest, string> = {
  [AuditTest.UNSPECIFIED]: "unknown",
  [AuditTest.BORDER_PROBE]: "border_probe",
  [AuditTest.MMD]: "mmd",
  [AuditTest.LOGPROB]: "logprob",
};

const at = (seconds: bigint | undefined) =>
  seconds === undefined ? "never" : new Date(Number(seconds) * 1000).toISOString();

/** One offer's standing as lines an operator reads: the decision, then each test's evidence. */
export function standingLines(s: AuditStanding): string[] {
  const a = s.audit;
  const reference =
    referenceWords[a?.referenceKind ?? AuditReferenceKind.UNSPECIFIED] +
    (s.referenceOfferId === "" ? "" : ` ${s.referenceOfferId}`);
  const lines = [
    `offer ${s.offerId} (model ${s.modelId})`,
    `  state ${stateWords[a?.state ?? AuditState.UNSPECIFIED]}${a?.modelMismatch === true ? " (model_mismatch)" : ""}: e-value ${a?.eValue ?? "1"}, flags at ${a?.flagAt || "-"}, excluded at ${a?.excludeAt || "-"}`,
    `  reference ${reference}; updated ${at(a?.updatedAt)}; evidence cleared ${at(s.clearedAt)}`,
  ];
  if (s.tests.length === 0) lines.push("  no test evidence (since the last clearing)");
  for (const t of s.tests)
    lines.push(
      `  ${testWords[t.test]}: ${t.samples} samples against ${t.referenceSamples} of the reference, statistic ${t.statistic}, p-value ${t.pValue ?? "-"}, e-value ${t.eValue}`,
    );
  return lines;
}

/**
 * `gateway audits`: the operator's view of the audits, from the gateway (so it is what every
 * process routes by). Returns the exit code: 0 answered, 1 the gateway could not be reached or
 * refused, 2 usage. The operator token goes out as gRPC metadata only; nothing printed here
 * contains it.
 */
export async function runAuditsCommand(
  args: string[],
  env: NodeJS.ProcessEnv,
  io: AuditsIo,
): Promise<number> {
  let values;
  try {
    const parsed = parseArgs({
      args,
      allowPositionals: true,
      options: { model: { type: "string" }, json: { type: "boolean" } },
    });
    values = parsed.values;
    const [extra] = parsed.positionals;
    if (extra === "help") {
      io.out(auditsUsage);
      return 0;
    }
    if (extra !== undefined) throw new AuditsUsageError(`unexpected argument '${extra}'`);
    if (values.model !== undefined && !isHex32(values.model))
      throw new AuditsUsageError("--model must be a 32-byte hex ModelID");
  } catch (error) {
    io.error(`${(error as Error).message}\n\n${auditsUsage}`);
    return 2;
  }
  let gateway;
  try {
    gateway = parseSettleConfig(env);
  } catch (error) {
    if (!(error instanceof ConfigError)) throw error;
    io.error(error.message);
    return 2;
  }
  const sessionManager = new Http2SessionManager(gateway.url);
  const client = createClient(
    AuditService,
    createGrpcTransport({ baseUrl: gateway.url, sessionManager }),
  );
  try {
    const res = await client.listAuditStandings(
      { modelId: values.model?.toLowerCase() ?? "" },
      operatorAuth(gateway.token),
    );
    if (values.json === true) {
      io.out(JSON.stringify(toJson(ListAuditStandingsResponseSchema, res), null, 2));
      return 0;
    }
    if (res.standings.length === 0) io.out("no offer has been judged by the audits yet");
    for (const s of res.standings) for (const line of standingLines(s)) io.out(line);
    return 0;
  } catch (error) {
    const failure = describeRpcFailure(error);
    io.error(
      failure.unreachable
        ? `the gateway at ${gateway.url} could not be reached: ${failure.message}`
        : `the gateway refused: ${failure.reason ?? failure.code}: ${failure.message}`,
    );
    return 1;
  } finally {
    sessionManager.abort();
  }
}
