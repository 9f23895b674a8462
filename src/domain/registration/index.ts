/**
 * Provider registration (DESIGN.md section 4): an offer's operator signs an EIP-712 challenge
 * binding its endpoint, and the gateway verifies it against the chain before storing the
 * endpoint sealed. This module gathers the names of its rooms (registration/): the typed data,
 * the signature's reading, the ports and the sealed endpoint, and the service.
 */
export {
  buildTypedData,
  defaultChallengeLifetimeSeconds,
  eip712DomainFields,
  endpointTokenHash,
  endpointUrlHash,
  maxChallengeLifetimeSeconds,
  registerEndpointFields,
  registrationDigest,
  registrationDomainName,
  registrationDomainVersion,
  withoutDomainType,
  type RegisterEndpointMessage,
  type RegistrationDomain,
  type RegistrationTypedData,
  type SignableRegistrationTypedData,
} from "./typed-data.js";
export { parseRegistrationSignature } from "./signature.js";
export {
  openEndpoint,
  sealEndpoint,
  type ChainOffer,
  type EndpointRegistration,
  type NonceUse,
  type OfferReader,
  type RecordRegistration,
  type RegistrationOutcome,
  type Sealer,
} from "./ports.js";
export {
  createRegistrationService,
  type ChallengeRequest,
  type RegisterRequest,
  type RegistrationService,
  type RegistrationServiceDeps,
} from "./service.js";
