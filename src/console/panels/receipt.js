/**
 * A request's signed usage receipt (GET /v1/requests/{id}/receipt), verified here in the browser
 * rather than taken on the gateway's word: the signer is recovered from the EIP-712 typed data
 * and signature (viem, bundled into /console/vendor/eip712.js), and must be the receipt signer
 * the gateway publishes (GET /v1/gateway); the domain must name that gateway's chain and market;
 * and what the receipt says was charged must be what the request's record says
 * (GET /v1/requests/{id}).
 */
import { segment } from "../api.js";
import { code, credits, facts, h, time } from "../dom.js";
import { modelUnits } from "../units.js";
import { idLookup } from "../lookup.js";
import { recoverTypedDataSigner, sameAddress } from "../vendor/eip712.js";

/** @type {import("../app.js").Panel} */
export const receiptPanel = {
  id: "receipt",
  title: "Usage receipt",
  mount(section, { api, events }) {
    const { form, input, message, view, load, select } = idLookup(section, api, {
      form: {
        id: "receipt-request-id",
        label: "Request id",
        hint: "A closed request that was charged has a receipt signed by the gateway.",
        button: "Verify receipt",
      },
      className: "receipt",
      loading: "Fetching and verifying…",
      read: async (id) => {
        const [signed, gateway, record] = await Promise.all([
          api.get(`/v1/requests/${segment(id)}/receipt`),
          api.get("/v1/gateway"),
          api.get(`/v1/requests/${segment(id)}`),
        ]);
        const checks = await verifyReceipt(signed, gateway, record);
        const units = await modelUnits(api, record.model);
        return () => {
          message.clear();
          view.replaceChildren(receiptView(id, signed, checks, units));
        };
      },
    });

    /** @param {string} id */
    function show(id) {
      input.value = select(id);
      void load();
    }

    form.addEventListener("submit", (event) => {
      event.preventDefault();
      show(input.value);
    });
    events.addEventListener("show-receipt", (event) => {
      show(/** @type {CustomEvent<string>} */ (event).detail);
      input.focus();
    });
    events.addEventListener("key", () => void load());
  },
};

/**
 * @typedef {object} Check
 * @property {string} name what is checked, as a reader says it
 * @property {boolean} ok
 * @property {string} detail what was found
 */

/**
 * Every check of a receipt against the gateway's published facts and the request's record.
 * @param {Record<string, any>} signed `{receipt, signature, signer}`
 * @param {Record<string, any>} gateway `GET /v1/gateway`
 * @param {Record<string, any>} record `GET /v1/requests/{id}`
 * @returns {Promise<Check[]>}
 */
export async function verifyReceipt(signed, gateway, record) {
  const { receipt } = signed;
  const m = receipt.message ?? {};
  const d = receipt.domain ?? {};
  /** @type {string | undefined} */
  let recovered;
  let failure = "";
  try {
    recovered = await recoverTypedDataSigner(receipt, signed.signature);
  } catch (error) {
    failure = String(/** @type {Error} */ (error).message ?? error).split("\n")[0];
  }
  const same = (a, b) => String(a) === String(b);
  const signer = gateway.receipt_signer;
  return [
    {
      name: "Signed by the gateway's receipt signer",
      ok: recovered !== undefined && signer !== null && sameAddress(recovered, signer),
      detail:
        recovered === undefined
          ? `the signature does not recover (${failure})`
          : `recovered ${recovered}; the gateway publishes ${signer ?? "no receipt signer"}`,
    },
    {
      name: "Domain chain id is the gateway's",
      ok: same(d.chainId, gateway.chain_id),
      detail: `receipt ${String(d.chainId)}, gateway ${String(gateway.chain_id)}`,
    },
    {
      name: "Domain market is the gateway's",
      ok: sameAddress(d.verifyingContract, gateway.market),
      detail: `receipt ${String(d.verifyingContract)}, gateway ${String(gateway.market)}`,
    },
    {
      name: "The receipt is this request's",
      ok:
        same(m.requestId, record.id) &&
        same(String(m.permitId).toLowerCase(), String(record.permit_id).toLowerCase()) &&
        same(String(m.offerId).toLowerCase(), String(record.offer_id).toLowerCase()),
      detail: `request ${String(m.requestId)}, permit ${String(m.permitId)}, offer ${String(m.offerId)}`,
    },
    {
      name: "Charge equals the request's",
      ok: same(m.charge, record.credits_charged),
      detail: `receipt ${String(m.charge)}, request ${String(record.credits_charged)}`,
    },
    {
      name: "Tokens equal the request's",
      ok: same(m.inputTokens, record.input_tokens) && same(m.outputTokens, record.output_tokens),
      detail: `receipt ${String(m.inputTokens)} in, ${String(m.outputTokens)} out; request ${String(record.input_tokens)} in, ${String(record.output_tokens)} out`,
    },
    {
      name: "Claim and count equal the request's",
      ok:
        same(m.usageSource, record.usage_source) &&
        sameFigures(m.claimed, record.usage_claimed) &&
        sameFigures(m.counted, record.usage_counted),
      detail: `receipt: charged from ${String(m.usageSource)}, claimed ${figures(m.claimed)}, counted ${figures(m.counted)}; request: charged from ${String(record.usage_source)}, claimed ${figures(record.usage_claimed)}, counted ${figures(record.usage_counted)}`,
    },
  ];
}

/**
 * A receipt's `UsageFigures` ({present, inputTokens, ...}) against the record's figures
 * ({input_tokens, ...} or null): both absent, or both present and equal in every kind.
 * @param {Record<string, any> | undefined} signed
 * @param {Record<string, any> | null | undefined} recorded
 */
function sameFigures(signed, recorded) {
  if (signed === undefined || signed === null) return false;
  if (recorded === null || recorded === undefined) return signed.present === false;
  return (
    signed.present === true &&
    String(signed.inputTokens) === String(recorded.input_tokens) &&
    String(signed.outputTokens) === String(recorded.output_tokens) &&
    String(signed.cachedTokens) === String(recorded.cached_input_tokens) &&
    String(signed.reasoningTokens) === String(recorded.reasoning_tokens)
  );
}

/**
 * Figures as a reader says them: "12 in, 5 out", or "none".
 * @param {Record<string, any> | null | undefined} f a receipt's or a record's figures
 */
function figures(f) {
  if (f === null || f === undefined || f.present === false) return "none";
  return `${String(f.inputTokens ?? f.input_tokens)} in, ${String(f.outputTokens ?? f.output_tokens)} out`;
}

/**
 * @param {string} id
 * @param {Record<string, any>} signed
 * @param {Check[]} checks
 * @param {{ decimals?: number, symbol?: string }} units the request's model's credit token's
 */
export function receiptView(id, signed, checks, units) {
  const verified = checks.every((c) => c.ok);
  const m = signed.receipt.message ?? {};
  return h(
    "article",
    {
      class: "card",
      "data-receipt-of": id,
      "data-verdict": verified ? "verified" : "not-verified",
    },
    // The verdict in words (and a mark), not only in colour.
    h(
      "p",
      { class: "verdict", "data-field": "verdict" },
      verified ? "✔ Verified" : "✘ Not verified",
      h(
        "span",
        { class: "muted" },
        verified
          ? ": signed by this gateway's receipt key, for this request and charge."
          : `: ${checks
              .filter((c) => !c.ok)
              .map((c) => c.name.toLowerCase())
              .join("; ")} — failed.`,
      ),
    ),
    h(
      "ul",
      { class: "checks" },
      ...checks.map((c) =>
        h(
          "li",
          { "data-check-ok": String(c.ok) },
          h("strong", {}, c.ok ? "Passes: " : "Fails: "),
          c.name,
          h("span", { class: "muted hex" }, ` (${c.detail})`),
        ),
      ),
    ),
    facts([
      ["Charge", credits(m.charge, units), "charge"],
      ["Input tokens", String(m.inputTokens)],
      ["Output tokens", String(m.outputTokens)],
      ["Billing", String(m.billing)],
      [
        "Charged from",
        m.usageSource === "provider"
          ? "the provider's claim"
          : m.usageSource === "gateway"
            ? "the gateway's count"
            : String(m.usageSource),
        "usage-source",
      ],
      ["Claimed by the provider", figures(m.claimed), "claimed"],
      ["Counted by the gateway", figures(m.counted), "counted"],
      ["Closed", time(typeof m.closedAt === "number" ? m.closedAt : undefined)],
      ["Signer", code(signed.signer)],
      ["Signature", code(signed.signature)],
    ]),
  );
}
