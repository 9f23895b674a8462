export * from "./types.js";
export { createInference } from "./pipeline.js";
export { rankCandidates } from "./routing.js";
