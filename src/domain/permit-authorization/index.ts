/**
 * Spending authority (DESIGN.md section 8): a permit is spent only by API keys its payer
 * authorized. The payer signs `AuthorizeKey` typed data naming the key's public id; the gateway
 * verifies the signature against the payer (ECDSA, or ERC-1271 for a contract wallet) and keeps
 * the authorization. Nothing here lets anyone but the payer create one: the gateway operator
 * holds no key that makes an authorization valid.
 *
 * This module gathers the names of its rooms (permit-authorization/): the typed data, the
 * authorizations and their caps, the key-authority cache, the storage port, the checks of a
 * request and the service's operations.
 */
export {
  anyPermit,
  authorizationDomainVersion,
  authorizeKeyFields,
  authorizeKeyFieldsBeforeWarnAt,
  buildAuthorizeKeyTypedData,
  buildListAuthorizationsTypedData,
  buildReadPayerRequestsTypedData,
  buildRevokeAuthorizationsTypedData,
  buildRevokeTypedData,
  defaultAuthorizationLifetimeSeconds,
  defaultMaxAuthorizationLifetimeSeconds,
  gatewaySigningDomain,
  gatewayTypedData,
  listAuthorizationsFields,
  listSignatureMaxLifetimeSeconds,
  readPayerRequestsFields,
  revokeAuthorizationsFields,
  revokeBeforeSkewSeconds,
  revokeKeyAuthorizationFields,
  signable,
  type AuthorizationDomain,
  type AuthorizeKeyMessage,
  type AuthorizeKeyTypedData,
  type ListAuthorizationsMessage,
  type ListAuthorizationsTypedData,
  type ReadPayerRequestsTypedData,
  type RevokeAuthorizationsMessage,
  type RevokeAuthorizationsTypedData,
  type RevokeKeyAuthorizationMessage,
  type RevokeKeyAuthorizationTypedData,
} from "./typed-data.js";
export {
  authorizationStatus,
  grantStatus,
  byCapOrder,
  budgetWarning,
  budgetWarningText,
  covers,
  fitsPerRequestCap,
  perRequestCapRefusal,
  periodCapRefusal,
  periodUse,
  reservesAgainstCap,
  totalCapRefusal,
  warnedCap,
  warnUse,
  type BudgetWarning,
  type AuthorizationStatus,
  type AuthorizationUse,
  type PermitAuthorization,
} from "./authorizations.js";
export {
  capPeriods,
  isAuthorizationPeriod,
  periodEnd,
  periodStart,
  type AuthorizationPeriod,
  type CapPeriod,
} from "./periods.js";
export {
  createKeyAuthorities,
  requireAuthority,
  type KeyAuthorities,
  type SpendingAuthority,
} from "./key-authorities.js";
export type { InsertOutcome, PayerRevocationFilter, PermitAuthorizationStore } from "./store.js";
export {
  challengeMaxAgeSeconds,
  issuedAtSkewSeconds,
  payerListDefaultLimit,
  payerListMaxLimit,
  readAuthorizationExpiry,
  readCaps,
} from "./checks.js";
export type { PermitAuthorizationServiceDeps } from "./service-context.js";
export { createPermitAuthorizationService } from "./service.js";
export type { PayerRevocation, PermitAuthorizationService } from "./service-types.js";
