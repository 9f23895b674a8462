export {
  checkPayment,
  claimedPayer,
  paymentItemOf,
  paymentRefusalCodes,
  paymentRequiredFor,
  PaymentRequiredError,
  permit2Address,
  requirementsFor,
  uptoProxyAddress,
  uptoWitnessTypes,
  x402PermitId,
  type PaymentCheck,
  type PriceAsked,
  type UptoPayment,
  type X402Terms,
} from "./payment.js";
export type {
  OpenedPayment,
  OpenRefusal,
  SimulatedSettlement,
  X402Payments,
  X402Store,
} from "./ports.js";
