// The console test's browser wallet, installed in the page before any of
// its scripts (CDP Page.addScriptToEvaluateOnNewDocument): an EIP-1193
// provider announced through EIP-6963, as wallet extensions are. It decides
// nothing itself: every request goes to the test process through the
// `reeveTestWallet` binding, which answers as a person and their wallet
// would (an account, a chain switch, a signature made with eth-account, or
// a refusal).
(() => {
  const listeners = new Map();
  const emit = (event, value) => (listeners.get(event) || []).forEach((fn) => fn(value));
  const provider = {
    async request({ method, params }) {
      const { result, error } = JSON.parse(await window.reeveTestWallet(JSON.stringify({ method, params: params || [] })));
      if (error) throw Object.assign(new Error(error.message), { code: error.code });
      if (method === "wallet_switchEthereumChain" || method === "wallet_addEthereumChain") {
        emit("chainChanged", (params[0] || {}).chainId);
      }
      return result;
    },
    on(event, fn) { listeners.set(event, [...(listeners.get(event) || []), fn]); return provider; },
    removeListener(event, fn) { listeners.set(event, (listeners.get(event) || []).filter((f) => f !== fn)); return provider; },
  };
  const info = Object.freeze({
    uuid: "0b8f6c2e-5d1a-4c3b-9e7f-2a6d4c8e1f30",
    name: "Reeve test wallet",
    icon: "data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 1 1'%3E%3Crect width='1' height='1' fill='%232f5bd3'/%3E%3C/svg%3E",
    rdns: "dev.reeve.test-wallet",
  });
  const announce = () => window.dispatchEvent(new CustomEvent("eip6963:announceProvider", { detail: Object.freeze({ info, provider }) }));
  window.addEventListener("eip6963:requestProvider", announce);
  announce();
})();
