import js from "@eslint/js";
import tseslint from "typescript-eslint";

export default tseslint.config(
  {
    ignores: [
      "gen/**",
      "node_modules/**",
      "dist/**",
      "src/console/vendor/**",
      ".gateway/**",
      "scratch/**",
      "contracts/artifacts/**",
      "src/adapters/chain/artifacts.ts",
    ],
  },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: { globals: { process: "readonly", console: "readonly" } },
    rules: {
      "@typescript-eslint/no-unused-vars": [
        "error",
        { argsIgnorePattern: "^_", varsIgnorePattern: "^_" },
      ],
      "@typescript-eslint/no-explicit-any": "error",
    },
  },
  {
    // The market console's browser modules (src/console): served as they are, no bundler.
    files: ["src/console/**/*.js"],
    languageOptions: {
      globals: Object.fromEntries(
        [
          "document",
          "sessionStorage",
          "fetch",
          "setTimeout",
          "clearTimeout",
          "Event",
          "CustomEvent",
          "EventTarget",
          "AbortSignal",
          "Node",
          "HTMLElement",
          "Storage",
        ].map((name) => [name, "readonly"]),
      ),
    },
  },
  {
    // The composition root wires, nothing else (issue 30): src/app.ts and src/app/ construct
    // and connect the rooms below; none of them reaches back up into it. (The typescript-eslint
    // rule, so that the transports' own no-restricted-imports below does not replace it.)
    files: [
      "src/domain/**",
      "src/connect/**",
      "src/rest/**",
      "src/adapters/**",
      "src/runtime/**",
      "src/clients/**",
      "src/schema/**",
    ],
    ignores: ["**/*.test.ts"],
    rules: {
      "@typescript-eslint/no-restricted-imports": [
        "error",
        {
          patterns: [
            {
              group: ["**/app/**", "**/app.js", "**/app.ts"],
              message:
                "composition-root-on-top: only the entry points (src/cli, src/dev, tests) import src/app.ts and src/app/.",
            },
          ],
        },
      ],
    },
  },
  {
    // Transports on domain types only (issue 30): the Connect services and the REST facade take
    // what they need through domain types and ports wired at composition (src/app), never from
    // an adapter.
    files: ["src/connect/**", "src/rest/**"],
    rules: {
      "no-restricted-imports": [
        "error",
        {
          patterns: [
            {
              group: ["**/adapters/**"],
              message:
                "transports-on-domain-types: src/connect and src/rest import domain types and ports, not src/adapters (wire adapters in src/app).",
            },
          ],
        },
      ],
    },
  },
);
