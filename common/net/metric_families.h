// Registering the services' Prometheus metrics (prometheus-cpp): a family of one name and help
// text, or its single unlabelled series, in one call.
#pragma once

#include <string>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace litellama::net {

inline prometheus::Family<prometheus::Counter>& counter_family(prometheus::Registry& r,
                                                               const std::string& name,
                                                               const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

inline prometheus::Family<prometheus::Gauge>& gauge_family(prometheus::Registry& r,
                                                           const std::string& name,
                                                           const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

inline prometheus::Family<prometheus::Histogram>& histogram_family(prometheus::Registry& r,
                                                                   const std::string& name,
                                                                   const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r);
}

inline prometheus::Counter* counter(prometheus::Registry& r, const std::string& name,
                                    const std::string& help) {
  return &counter_family(r, name, help).Add({});
}

inline prometheus::Gauge* gauge(prometheus::Registry& r, const std::string& name,
                                const std::string& help) {
  return &gauge_family(r, name, help).Add({});
}

inline prometheus::Histogram* histogram(prometheus::Registry& r, const std::string& name,
                                        const std::string& help,
                                        const prometheus::Histogram::BucketBoundaries& buckets) {
  return &histogram_family(r, name, help).Add({}, buckets);
}

}  // namespace litellama::net
