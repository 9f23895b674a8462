/**
 * The console's entry: the API key form and the panels. Each panel is one module exporting
 * `{ id, title, mount(section, context) }`; adding one is a module and a line in `dashboard` or `lookups`.
 *
 * Panels talk through `context.events`:
 *   "key"         the key was set or forgotten (reload what you show, or clear it)
 *   "ledger"      a request's settlement moved (balances may have changed)
 *   "show-permit" `detail` is a permit id to show
 *   "show-receipt" `detail` is a request id whose receipt to verify
 */
import { createApi } from "./api.js";
import { h } from "./dom.js";
import { catalogPanel } from "./panels/catalog.js";
import { comparePanel } from "./panels/compare.js";
import { earningsPanel } from "./panels/earnings.js";
import { offerEarningsPanel } from "./panels/offer-earnings.js";
import { permitPanel } from "./panels/permit.js";
import { permitsPanel } from "./panels/permits.js";
import { receiptPanel } from "./panels/receipt.js";
import { requestPanel } from "./panels/request.js";
import { requestsPanel } from "./panels/requests.js";
import { spendPanel } from "./panels/spend.js";

/**
 * @typedef {object} PanelContext
 * @property {import("./api.js").Api} api
 * @property {EventTarget} events
 */
/**
 * @typedef {object} Panel
 * @property {string} id
 * @property {string} title
 * @property {(section: HTMLElement, context: PanelContext) => void} mount
 */

/**
 * The panels, in page (and focus) order: first what a key holder lives with (nothing to paste
 * but the key), then the catalog's details and the lookups by id. @type {Panel[]}
 */
const dashboard = [permitsPanel, spendPanel, requestsPanel, comparePanel, offerEarningsPanel];
const lookups = [catalogPanel, permitPanel, requestPanel, receiptPanel, earningsPanel];

const api = createApi(sessionStorage);
const events = new EventTarget();

const host = /** @type {HTMLElement} */ (document.getElementById("panels"));
for (const panel of [...dashboard, ...lookups]) {
  if (panel === lookups[0])
    host.append(
      h(
        "p",
        { class: "divider", id: "advanced" },
        "Advanced: the catalog in full, and a permit, a request, a receipt or an offer's earnings by its id.",
      ),
    );
  const titleId = `${panel.id}-title`;
  const section = h(
    "section",
    { class: "panel", id: `${panel.id}-panel`, "aria-labelledby": titleId },
    h("h2", { id: titleId }, panel.title),
  );
  host.append(section);
  panel.mount(section, { api, events });
}

const form = /** @type {HTMLFormElement} */ (document.getElementById("key-form"));
const input = /** @type {HTMLInputElement} */ (document.getElementById("api-key"));
const status = /** @type {HTMLElement} */ (document.getElementById("key-status"));
const forget = /** @type {HTMLButtonElement} */ (document.getElementById("forget-key"));

function showKeyState() {
  const has = api.hasKey();
  status.textContent = has
    ? "A key is in use for this tab."
    : "No key yet: paste one to read the market.";
  forget.disabled = !has;
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const key = input.value.trim();
  if (key === "") return;
  api.setKey(key);
  // The field is emptied: the key lives in session storage, not in the page.
  input.value = "";
  showKeyState();
  events.dispatchEvent(new Event("key"));
});

forget.addEventListener("click", () => {
  api.forgetKey();
  showKeyState();
  events.dispatchEvent(new Event("key"));
  input.focus();
});

showKeyState();
if (api.hasKey()) events.dispatchEvent(new Event("key"));
