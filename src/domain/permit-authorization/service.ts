/**
 * The authorization service (DESIGN.md section 8): a small factory over the operations of an API
 * key (key-operations.ts) and of a payer (payer-operations.ts).
 */
import { authorize, createChallenge, listForKey, revokeByKey } from "./key-operations.js";
import {
  listForPayer,
  payerReader,
  revocationChallenge,
  revokeBySignature,
  revokeForPayer,
} from "./payer-operations.js";
import type { PermitAuthorizationServiceDeps } from "./service-context.js";
import type { PermitAuthorizationService } from "./service-types.js";

export function createPermitAuthorizationService(
  deps: PermitAuthorizationServiceDeps,
): PermitAuthorizationService {
  return {
    createChallenge: (req) => createChallenge(deps, req),
    authorize: (req) => authorize(deps, req),
    list: (apiKeyId) => listForKey(deps, apiKeyId),
    revoke: (req) => revokeByKey(deps, req),
    revocationChallenge: (id) => revocationChallenge(deps, id),
    revokeBySignature: (req) => revokeBySignature(deps, req),
    listForPayer: (req) => listForPayer(deps, req),
    payerReader: (req) => payerReader(deps, req),
    revokeForPayer: (req) => revokeForPayer(deps, req),
  };
}
