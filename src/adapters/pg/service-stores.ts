import type pg from "pg";
import type { Hex } from "viem";
import type { RecordRegistration } from "../../domain/registration/index.js";
import type { RequestFilter, UsageBucket, UsageScope } from "../../domain/activity.js";
import { listRequests, usageGroups } from "./activity.js";
import { listBatches } from "./earnings.js";
import { permitsOpenedBy } from "./opened-permits.js";
import { permitLedger } from "./ledger/index.js";
import { recordRegistration } from "./registrations.js";
import { getRequest, listChargedRequests } from "./requests.js";

/**
 * What the RPC services read from the database besides the chat pipeline's stores (src/connect:
 * InferenceService's requests, permit ledgers and charged requests; SettlementService's
 * batches), each bound to the pool once by the composition root.
 */
export function createPgServiceReads(pool: pg.Pool) {
  return {
    findRequest: (id: string, apiKeyId: string) => getRequest(pool, id, apiKeyId),
    permitLedger: (permitId: Hex) => permitLedger(pool, permitId),
    listCharged: (permitId: Hex, limit: number, startingAfter: string | undefined) =>
      listChargedRequests(pool, permitId, limit, startingAfter),
    listRequests: (
      apiKeyId: string,
      filter: RequestFilter,
      limit: number,
      startingAfter: string | undefined,
    ) => listRequests(pool, apiKeyId, filter, limit, startingAfter),
    usage: (scope: UsageScope, bucket: UsageBucket, from: number, to: number) =>
      usageGroups(pool, scope, bucket, from, to),
    listBatches: (args: Parameters<typeof listBatches>[1]) => listBatches(pool, args),
    permitsOpenedBy: (payers: readonly Hex[], limit: number) =>
      permitsOpenedBy(pool, payers, limit),
  };
}

/** Provider registration's write: the nonce used and the endpoint sealed, in one transaction. */
export function createPgRegistrationRecorder(pool: pg.Pool): RecordRegistration {
  return (nonce, registration) => recordRegistration(pool, nonce, registration);
}
