// Refresh the #live part of the page every data-refresh seconds while it is visible, without
// a reload (no scroll jump, no lost focus in the header's search box).
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var every = Math.max(2, parseInt(live.getAttribute("data-refresh"), 10) || 5) * 1000;
  function refresh() {
    if (document.visibilityState !== "visible") { return; }
    fetch(window.location.href, {credentials: "same-origin", cache: "no-store"})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("live");
        if (fresh) { live.innerHTML = fresh.innerHTML; }
      })
      .catch(function () { /* the next tick tries again */ });
  }
  window.setInterval(refresh, every);
}());
