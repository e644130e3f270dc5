#include "transport/ucx/rma_policy.h"

#include <uct/api/uct.h>

#include <vector>

namespace ferry::internal::ucx {
namespace {

bool IsShm(const std::string& t) {
  return t == "posix" || t == "sysv" || t == "cma" || t == "xpmem" || t == "knem";
}
bool IsRdma(const std::string& t) {
  return t.rfind("rc", 0) == 0 || t.rfind("dc", 0) == 0;
}

// Does one entry of UCX_TLS (an alias or a name) select transport `t`?
bool Matches(std::string_view entry, const std::string& t) {
  if (entry == t || entry == "all") return true;
  if (entry == "shm" || entry == "sm") return IsShm(t);
  if (entry == "mm") return t == "posix" || t == "sysv" || t == "xpmem";
  if (entry == "rc" || entry == "rc_x" || entry == "rc_v") return t.rfind("rc", 0) == 0;
  if (entry == "dc" || entry == "dc_x") return t.rfind("dc", 0) == 0;
  if (entry == "ud" || entry == "ud_x" || entry == "ud_v") return t.rfind("ud", 0) == 0;
  if (entry == "ib") return IsRdma(t) || t.rfind("ud", 0) == 0;
  return false;
}

}  // namespace

RmaPolicy DecideRma(const std::set<std::string>& available, std::string_view tls) {
  bool exclude = !tls.empty() && tls.front() == '^';
  if (exclude) tls.remove_prefix(1);
  std::vector<std::string_view> entries;
  while (!tls.empty()) {
    size_t comma = tls.find(',');
    std::string_view e = tls.substr(0, comma);
    if (!e.empty()) entries.push_back(e);
    if (comma == std::string_view::npos) break;
    tls.remove_prefix(comma + 1);
  }
  bool unrestricted = entries.empty() || (!exclude && entries.size() == 1 && entries[0] == "all");
  RmaPolicy policy;
  for (const std::string& t : available) {
    bool selected = unrestricted;
    if (!unrestricted) {
      bool any = false;
      for (auto e : entries) any = any || Matches(e, t);
      selected = exclude ? !any : any;
    }
    if (!selected) continue;
    if (IsShm(t)) policy.same_host_native = true;
    if (IsRdma(t)) policy.network_native = true;
  }
  // RDMA reaches peers on this host too.
  policy.same_host_native = policy.same_host_native || policy.network_native;
  return policy;
}

std::set<std::string> AvailableUctTransports() {
  std::set<std::string> out;
  uct_component_h* components = nullptr;
  unsigned num_components = 0;
  if (uct_query_components(&components, &num_components) != UCS_OK) return out;
  for (unsigned c = 0; c < num_components; ++c) {
    uct_component_attr_t attr = {};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    for (const auto& md_desc : mds) {
      uct_md_config_t* config = nullptr;
      if (uct_md_config_read(components[c], nullptr, nullptr, &config) != UCS_OK) continue;
      uct_md_h md = nullptr;
      ucs_status_t st = uct_md_open(components[c], md_desc.md_name, config, &md);
      uct_config_release(config);
      if (st != UCS_OK) continue;
      uct_tl_resource_desc_t* resources = nullptr;
      unsigned num = 0;
      if (uct_md_query_tl_resources(md, &resources, &num) == UCS_OK) {
        for (unsigned i = 0; i < num; ++i) out.insert(resources[i].tl_name);
        uct_release_tl_resource_list(resources);
      }
      uct_md_close(md);
    }
  }
  uct_release_component_list(components);
  return out;
}

}  // namespace ferry::internal::ucx
