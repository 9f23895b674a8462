import { create } from "@bufbuild/protobuf";
import type { Hex } from "viem";
import {
  GetUsageResponseSchema,
  ListPermitsResponseSchema,
  ListRequestsResponseSchema,
  PermitBalanceSchema,
  RequestStatus,
  UsageBucket as UsageBucketMessage,
  type GetUsageRequest,
  type GetUsageResponse,
  type ListPermitsResponse,
  type ListRequestsRequest,
  type ListRequestsResponse,
  type PermitBalance as PermitBalanceMessage,
} from "../../gen/gateway/v1/inference_pb.js";
import {
  requestPage,
  usageRange,
  type RequestFilter,
  type UsageBucket,
  type UsageGroup,
  type UsageScope,
} from "../domain/activity.js";
import { GatewayError } from "../domain/errors.js";
import { isHex32, normalizeHex } from "../domain/hex.js";
import {
  anyPermit,
  authorizationStatus,
  requireAuthority,
  type PermitAuthorization,
} from "../domain/permit-authorization/index.js";
import {
  readPermitBalance,
  type PermitBalance,
  type PermitLedger,
} from "../domain/permit-balance.js";
import type { RequestRecord, RequestStatus as DomainStatus } from "../domain/requests.js";
import type { Caller } from "./context.js";
import { permitStateToProto, requestMessage } from "./inference-messages.js";
import type { Inference } from "../domain/chat/index.js";
import { readPermit, type PermitReader } from "../domain/permits.js";

/**
 * InferenceService's activity RPCs (DESIGN.md section 13): ListRequests, GetUsage, ListPermits.
 * The database answers by index (adapters/pg/activity.ts); who may ask what is decided here, from
 * the caller the guard admitted.
 */

export interface InferenceActivityDeps {
  /** A key's records newest first, narrowed by `filter` (adapters/pg/activity.ts). */
  readonly listRequests: (
    apiKeyId: string,
    filter: RequestFilter,
    limit: number,
    startingAfter: string | undefined,
  ) => Promise<RequestRecord[]>;
  /** The usage groups of a key's or a permit's requests made in `[from, to)`. */
  readonly usage: (
    scope: UsageScope,
    bucket: UsageBucket,
    from: number,
    to: number,
  ) => Promise<UsageGroup[]>;
  /** The key's authorizations (any status), as PermitService lists them. */
  readonly authorizations: (apiKeyId: string) => Promise<PermitAuthorization[]>;
  /** The newest `limit` permits the chain says these payers opened (adapters/pg/opened-permits.ts). */
  readonly permitsOpenedBy: (payers: readonly Hex[], limit: number) => Promise<Hex[]>;
}

/**
 * The most permits GET /v1/permits lists for the payers of a key's every-permit authorizations
 * (the newest the payers opened); the permits authorizations name are listed besides.
 */
export const everyPermitListed = 100;

/** What the activity RPCs read (InferenceServiceDeps, inference-service.ts, holds it all). */
export interface ActivityContext {
  readonly activity: InferenceActivityDeps;
  readonly inference: Pick<Inference, "whenAllRecorded">;
  readonly permits: PermitReader;
  readonly permitLedger: (permitId: Hex) => Promise<PermitLedger>;
  /** Unix seconds. */
  readonly clock: () => number;
  /** Unix seconds a permit's expiry is judged by (GetPermit's); default `clock`. */
  readonly permitClock?: (() => number) | undefined;
}

const statusFromProto: Partial<Record<RequestStatus, DomainStatus>> = {
  [RequestStatus.PENDING]: "pending",
  [RequestStatus.STREAMING]: "streaming",
  [RequestStatus.COMPLETED]: "completed",
  [RequestStatus.FAILED]: "failed",
  [RequestStatus.CANCELLED]: "cancelled",
};

const bucketFromProto: Partial<Record<UsageBucketMessage, UsageBucket>> = {
  [UsageBucketMessage.UNSPECIFIED]: "day",
  [UsageBucketMessage.HOUR]: "hour",
  [UsageBucketMessage.DAY]: "day",
};

async function read<T>(what: string, run: () => Promise<T>): Promise<T> {
  try {
    return await run();
  } catch (err) {
    if (err instanceof GatewayError) throw err;
    throw new GatewayError("database_unavailable", `${what} could not be read`, { cause: err });
  }
}

function unixSeconds(name: string, value: bigint | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (value < 0n || value > BigInt(Number.MAX_SAFE_INTEGER))
    throw new GatewayError("invalid_request", `'${name}' must be Unix seconds`);
  return Number(value);
}

function filterOf(req: ListRequestsRequest): RequestFilter {
  if (req.permitId !== "" && !isHex32(req.permitId))
    throw new GatewayError("invalid_hex", "the permit id must be a Hex32");
  const status = req.status === RequestStatus.UNSPECIFIED ? undefined : statusFromProto[req.status];
  if (req.status !== RequestStatus.UNSPECIFIED && status === undefined)
    throw new GatewayError("invalid_request", "unknown request status");
  return {
    model: req.model === "" ? undefined : req.model,
    permitId: req.permitId === "" ? undefined : normalizeHex(req.permitId),
    status,
    createdAfter: unixSeconds("created_after", req.createdAfter),
    createdBefore: unixSeconds("created_before", req.createdBefore),
  };
}

export async function listRequests(
  deps: ActivityContext,
  caller: Caller,
  req: ListRequestsRequest,
): Promise<ListRequestsResponse> {
  if (req.startingAfter !== "" && !isHex32(req.startingAfter))
    throw new GatewayError("invalid_hex", "starting_after must be a request id (Hex32)");
  if (req.limit > requestPage.max)
    throw new GatewayError("invalid_request", `limit must be 1 to ${requestPage.max}`);
  const filter = filterOf(req);
  const limit = req.limit === 0 ? requestPage.default : req.limit;
  // Read your writes, as GetRequest: an answer this process just gave may still be recording
  // its record (opened in a batch, closed just after the answer).
  await deps.inference.whenAllRecorded();
  const records = await read("the requests", () =>
    deps.activity.listRequests(
      caller.apiKeyId,
      filter,
      limit + 1,
      req.startingAfter === "" ? undefined : normalizeHex(req.startingAfter),
    ),
  );
  return create(ListRequestsResponseSchema, {
    requests: records.slice(0, limit).map(requestMessage),
    hasMore: records.length > limit,
  });
}

export async function getUsage(
  deps: ActivityContext,
  caller: Caller,
  req: GetUsageRequest,
): Promise<GetUsageResponse> {
  const bucket = bucketFromProto[req.bucket];
  if (bucket === undefined) throw new GatewayError("invalid_request", "unknown usage bucket");
  const now = deps.clock();
  const range = usageRange(
    bucket,
    { from: unixSeconds("from", req.from), to: unixSeconds("to", req.to) },
    now,
  );
  let scope: UsageScope = { apiKeyId: caller.apiKeyId };
  if (req.permitId !== "") {
    if (!isHex32(req.permitId))
      throw new GatewayError("invalid_hex", "the permit id must be a Hex32");
    const permitId = normalizeHex(req.permitId);
    // Who may see a permit's usage is who may see its balance (GetPermit): keys its payer
    // authorized, judged from memory on the permit read from the chain, before the database.
    requireAuthority(caller.authority, await readPermit(deps.permits, permitId), now);
    scope = { permitId };
  }
  if (!("permitId" in scope)) await deps.inference.whenAllRecorded();
  const groups = await read("the usage", () =>
    deps.activity.usage(scope, bucket, range.from, range.to),
  );
  return create(GetUsageResponseSchema, {
    bucket: bucket === "hour" ? UsageBucketMessage.HOUR : UsageBucketMessage.DAY,
    permitId: "permitId" in scope ? scope.permitId : "",
    from: BigInt(range.from),
    to: BigInt(range.to),
    groups: groups.map((g) => ({
      startsAt: BigInt(g.startsAt),
      model: g.model,
      offerId: g.offerId,
      requests: g.requests,
      inputTokens: g.inputTokens,
      outputTokens: g.outputTokens,
      claimedInputTokens: g.claimedInputTokens,
      claimedOutputTokens: g.claimedOutputTokens,
      countedInputTokens: g.countedInputTokens,
      countedOutputTokens: g.countedOutputTokens,
      credits: g.credits.toString(),
    })),
  });
}

export function permitBalanceMessage(balance: PermitBalance): PermitBalanceMessage {
  return create(PermitBalanceSchema, {
    permitId: balance.permitId,
    state: permitStateToProto[balance.state],
    modelId: balance.modelId,
    offerId: balance.offerId ?? "",
    payer: balance.payer,
    expiresAt: BigInt(balance.expiresAt),
    closableAt: balance.closableAt === undefined ? undefined : BigInt(balance.closableAt),
    deposit: balance.deposit.toString(),
    settled: balance.settled.toString(),
    chargedUnsettled: balance.chargedUnsettled.toString(),
    reserved: balance.reserved.toString(),
    available: balance.available.toString(),
  });
}

/**
 * The balance of a permit an authorization of the caller names, as GetPermit reads it; undefined
 * when the chain has no such permit or its payer is not the authorization's (it covers nothing).
 */
async function namedBalance(
  deps: ActivityContext,
  caller: Caller,
  permitId: Hex,
  now: number,
): Promise<PermitBalance | undefined> {
  try {
    return await readPermitBalance(permitId, {
      permits: deps.permits,
      ledger: deps.permitLedger,
      now: deps.permitClock === undefined ? now : Math.max(now, deps.permitClock()),
      authorize: (permit) => requireAuthority(caller.authority, permit, now),
    });
  } catch (err) {
    if (
      err instanceof GatewayError &&
      (err.code === "permit_not_found" || err.code === "permit_not_authorized")
    )
      return undefined;
    throw err;
  }
}

export async function listPermits(
  deps: ActivityContext,
  caller: Caller,
): Promise<ListPermitsResponse> {
  const now = deps.clock();
  const active = (
    await read("the authorizations", () => deps.activity.authorizations(caller.apiKeyId))
  ).filter((a) => authorizationStatus(a, now) === "active");
  const named = [...new Set(active.filter((a) => a.permitId !== anyPermit).map((a) => a.permitId))];
  const payers = [...new Set(active.filter((a) => a.permitId === anyPermit).map((a) => a.payer))];
  // A payer's every-permit authorization covers each permit it opened: the chain lists none, so
  // the indexer keeps them from PermitOpened. Each is still read and checked as a named one.
  const opened = await read("the permits opened", () =>
    deps.activity.permitsOpenedBy(payers, everyPermitListed),
  );
  const ids = [...new Set([...named, ...opened.map(normalizeHex)])].sort();
  const balances = await Promise.all(ids.map((id) => namedBalance(deps, caller, id, now)));
  return create(ListPermitsResponseSchema, {
    permits: balances.filter((b) => b !== undefined).map(permitBalanceMessage),
    everyPermitPayers: payers.sort(),
  });
}
