import type { DevManifest } from "./sandbox.js";

/**
 * The ten lines `npm start` prints for an agent that pays per request with x402 (issue 37, item
 * 7; docs/agents.md): an unmodified `@x402/fetch` with the upto scheme, the demo payer's key
 * read from the manifest (never printed), allowed this market's credit token up to one token
 * per request.
 */
export function sandboxAgentExample(manifest: DevManifest, manifestPath: string): string {
  const model = manifest.models[0]!;
  const lines = [
    `import { wrapFetchWithPayment, x402Client } from "@x402/fetch";`,
    `import { UptoEvmScheme } from "@x402/evm/upto/client";`,
    `import { privateKeyToAccount } from "viem/accounts";`,
    `import { readFileSync } from "node:fs";`,
    `const key = JSON.parse(readFileSync(${JSON.stringify(manifestPath)}, "utf8")).payer.privateKey;`,
    `const client = new x402Client().register("eip155:*", new UptoEvmScheme(privateKeyToAccount(key)));`,
    `client.setSpendControls({ allowedAssets: [{ network: "eip155:${manifest.chainId}", asset: "${model.creditToken}", maxAmountPerPayment: "1000000000000000000" }] });`,
    `const res = await wrapFetchWithPayment(fetch, client)("${manifest.baseUrl}/v1/chat/completions", { method: "POST", headers: { "content-type": "application/json" },`,
    `  body: JSON.stringify({ model: "${model.id}", messages: [{ role: "user", content: "hi" }] }) });`,
    `console.log(res.status, res.headers.get("x-gateway-credits-charged"), await res.json());`,
  ];
  return (
    `An agent pays per request with x402, no API key and no permit (docs/agents.md); as an .mjs\n` +
    `file in this checkout (the demo payer has approved Permit2 once):\n` +
    lines.map((l) => `  ${l}\n`).join("") +
    "\n"
  );
}
