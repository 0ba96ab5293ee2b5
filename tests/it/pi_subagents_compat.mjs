// Runs pi-subagents 0.67's own readers over a temp root that runjournal made, and prints what
// they saw as one JSON object. Driven by tests/it/pi_subagents_compat.rs.
//
//   node pi_subagents_compat.mjs INSTALL_DIR --temp-root
//       prints {"tempRoot": TEMP_ROOT_DIR} (pi-subagents' root for this environment)
//   node pi_subagents_compat.mjs INSTALL_DIR --read SESSION_ID
//       with PI_SUBAGENTS_TEMP_ROOT set: for every run directory, readStatus,
//       reconcileAsyncRun and the session's result lookup (and what the result it leads to
//       says of each step); then listAsyncRuns four ways. With PI_COMPAT_STALE_ALIVE_MS set,
//       reconcileAsyncRun judges a live runner stale after that long instead of 24 h.
//
// The package ships TypeScript only; jiti (one of its own dependencies) loads it on Node 20.

import * as fs from "node:fs";
import { createRequire } from "node:module";
import * as path from "node:path";

const [installDir, mode, sessionId] = process.argv.slice(2);
const require = createRequire(path.join(installDir, "package.json"));
const { createJiti } = require("jiti");
const jiti = createJiti(path.join(installDir, "package.json"));
const source = path.join(installDir, "node_modules", "pi-subagents", "src");
const load = (file) => jiti.import(path.join(source, file));

const types = await load("shared/types.ts");
if (mode === "--temp-root") {
	console.log(JSON.stringify({ tempRoot: types.TEMP_ROOT_DIR }));
	process.exit(0);
}
if (mode === "--control") {
	// node pi_subagents_compat.mjs INSTALL_DIR --control ACTION ASYNC_DIR [RESULTS_DIR|MESSAGE]
	//   ACTION: stop | stop-step (STEP) | interrupt | timeout | steer (MESSAGE) |
	//   reconcile (RESULTS_DIR) | status; pi-subagents' own requestAsyncStop (with a targetIndex
	//   for stop-step), requestAsyncInterrupt, requestAsyncTimeout, requestAsyncSteer,
	//   reconcileAsyncRun or readStatus; prints {"done": what it returned}.
	//   With PI_COMPAT_STALE_ALIVE_MS set, reconcile judges a live pid stale after that long.
	const [, , action, asyncDir, extra] = process.argv.slice(2);
	const staleAlivePidMs = process.env.PI_COMPAT_STALE_ALIVE_MS ? Number(process.env.PI_COMPAT_STALE_ALIVE_MS) : undefined;
	const control = await load("runs/background/control-channel.ts");
	let done;
	if (action === "stop") done = control.requestAsyncStop(asyncDir, { source: "pi-compat", reason: "stopped by the host" });
	else if (action === "stop-step") done = control.requestAsyncStop(asyncDir, { source: "pi-compat", reason: "this child is done", targetIndex: Number(extra) });
	else if (action === "interrupt") done = control.requestAsyncInterrupt(asyncDir, { source: "pi-compat" });
	else if (action === "timeout") done = control.requestAsyncTimeout(asyncDir, { source: "pi-compat", reason: "the host's deadline" });
	else if (action === "steer") done = control.requestAsyncSteer(asyncDir, { message: extra, source: "pi-compat" });
	else if (action === "reconcile") {
		const { reconcileAsyncRun } = await load("runs/background/stale-run-reconciler.ts");
		const reconciled = reconcileAsyncRun(asyncDir, { resultsDir: extra, ...(staleAlivePidMs === undefined ? {} : { staleAlivePidMs }) });
		done = { repaired: reconciled.repaired, state: reconciled.status?.state ?? null };
	} else if (action === "status") {
		const { readStatus } = await load("shared/utils.ts");
		const status = readStatus(asyncDir);
		done = {
			state: status?.state ?? null,
			steering: status?.steering ?? null,
			timeoutMs: status?.timeoutMs ?? null,
			steps: (status?.steps ?? []).map((step) => ({ status: step.status, stopRequested: step.stopRequested ?? null })),
		};
	} else throw new Error(`unknown control action ${action}`);
	console.log(JSON.stringify({ done: done ?? null }));
	process.exit(0);
}
if (mode !== "--read") throw new Error(`unknown mode ${mode}`);

const { readStatus } = await load("shared/utils.ts");
const { listAsyncRuns } = await load("runs/background/async-status.ts");
const { reconcileAsyncRun } = await load("runs/background/stale-run-reconciler.ts");
const { resultPayloadPathForSessionRun, resultPayloadPathForIndexedRun, resultFilesForToolCall } = await load("runs/background/result-files.ts");
const { formatAsyncRunTranscript } = await load("runs/background/fleet-view.ts");
const { readProcessTerminal } = await load("runs/background/process-terminal.ts");

const staleAlivePidMs = process.env.PI_COMPAT_STALE_ALIVE_MS ? Number(process.env.PI_COMPAT_STALE_ALIVE_MS) : undefined;
const asyncRoot = types.DIRS.async;
const resultsDir = types.DIRS.results;
const report = { tempRoot: types.TEMP_ROOT_DIR, asyncRoot, resultsDir, runs: {}, listed: {} };
const message = (error) => String(error?.message ?? error);

for (const id of fs.readdirSync(asyncRoot).filter((entry) => !entry.startsWith("."))) {
	const asyncDir = path.join(asyncRoot, id);
	const seen = {};
	try {
		const status = readStatus(asyncDir);
		seen.read = status && {
			runId: status.runId,
			state: status.state,
			mode: status.mode,
			sessionId: status.sessionId ?? null,
			hasPid: typeof status.pid === "number",
			steps: (status.steps ?? []).map((step) => step.status),
		};
		// The proof sidecar as pi-subagents' reader takes it: its state, and whose exits it holds.
		const proof = readProcessTerminal(asyncDir);
		seen.proof = proof && {
			state: proof.state,
			reason: proof.reason ?? null,
			kinds: (proof.instances ?? []).map((instance) => instance.kind),
			trees: (proof.instances ?? []).filter((instance) => instance.processTree).map((instance) => instance.processTree.state),
		};
		// The transcript view names the run's markdown log when the run has one.
		if (status) {
			const transcript = formatAsyncRunTranscript(status, asyncDir);
			seen.log = transcript.split("\n").find((line) => line.includes("Log: "))?.trim() ?? null;
		}
	} catch (error) {
		seen.readError = message(error);
	}
	try {
		const reconciled = reconcileAsyncRun(asyncDir, { resultsDir, ...(staleAlivePidMs === undefined ? {} : { staleAlivePidMs }) });
		seen.repaired = reconciled.repaired;
		seen.reconciledState = reconciled.status?.state ?? null;
		seen.message = reconciled.message ?? null;
	} catch (error) {
		seen.reconcileError = message(error);
	}
	try {
		seen.resultPath = resultPayloadPathForSessionRun(resultsDir, sessionId, id) ?? null;
		// The run's own index entry, as pi-subagents' runner writes it.
		seen.indexedResultPath = resultPayloadPathForIndexedRun(resultsDir, id) ?? null;
		if (seen.resultPath) {
			// What the result watcher hands the host's agent: the summary and each step's output.
			const data = JSON.parse(fs.readFileSync(seen.resultPath, "utf-8"));
			seen.result = {
				state: data.state,
				success: data.success,
				exitCode: data.exitCode,
				summary: data.summary,
				error: data.error,
				stopped: data.stopped,
				timedOut: data.timedOut,
				truncated: data.truncated,
				cwd: data.cwd,
				results: (data.results ?? []).map((result) => ({
					agent: result.agent,
					output: result.output,
					outputState: result.outputState,
					success: result.success,
					exitCode: result.exitCode,
				})),
			};
		}
	} catch (error) {
		seen.resultError = message(error);
	}
	report.runs[id] = seen;
}

const listing = (options) => {
	try {
		return listAsyncRuns(asyncRoot, { resultsDir, ...options }).map((run) => ({ id: run.id, state: run.state }));
	} catch (error) {
		return { error: message(error) };
	}
};
// The results indexed by the tool call the compatibility test launched one run for.
report.toolCallResults = resultFilesForToolCall(resultsDir, "call-for-compat");
report.listed.default = listing({});
report.listed.session = listing({ sessionId });
report.listed.activeForSession = listing({ sessionId, states: ["queued", "running"] });
report.listed.repairScan = listing({ repairScan: true });
console.log(JSON.stringify(report));
