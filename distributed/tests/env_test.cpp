// Launch-environment discovery (precedence, job tokens, master defaults), CommOptions from
// CORTADO_* variables, byte sizes and element conversions.
#include "cortado/dist/env.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "cortado/dist/error.h"
#include "cortado/dist/types.h"

namespace cortado::dist {
namespace {

EnvLookup Fake(std::map<std::string, std::string> vars) {
  return [vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnv, NothingSetMeansOneRank) {
  LaunchInfo info = DiscoverLaunchInfo(Fake({}));
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.source, "default");
}

TEST(LaunchEnv, CortadoBeatsTorchrunBeatsMpirunBeatsSlurm) {
  std::map<std::string, std::string> vars = {{"CORTADO_RANK", "1"},
                                             {"CORTADO_WORLD_SIZE", "4"},
                                             {"CORTADO_MASTER_PORT", "1234"},
                                             {"RANK", "2"},
                                             {"WORLD_SIZE", "8"},
                                             {"MASTER_ADDR", "10.0.0.9"},
                                             {"MASTER_PORT", "29500"},
                                             {"OMPI_COMM_WORLD_RANK", "3"},
                                             {"OMPI_COMM_WORLD_SIZE", "16"},
                                             {"SLURM_PROCID", "5"},
                                             {"SLURM_NTASKS", "32"},
                                             {"SLURM_JOB_ID", "77"},
                                             {"CORTADO_JOB_TOKEN", "t"}};
  LaunchInfo info = DiscoverLaunchInfo(Fake(vars));
  EXPECT_EQ(info.source, "cortado");
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.master_port, 1234);        // CORTADO_MASTER_PORT beats MASTER_PORT
  EXPECT_EQ(info.master_addr, "10.0.0.9");  // no CORTADO_MASTER_ADDR: MASTER_ADDR
  EXPECT_EQ(info.job_token, "t");
  vars.erase("CORTADO_RANK");
  vars.erase("CORTADO_WORLD_SIZE");
  info = DiscoverLaunchInfo(Fake(vars));
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 8);
  vars.erase("RANK");
  vars.erase("WORLD_SIZE");
  info = DiscoverLaunchInfo(Fake(vars));
  EXPECT_EQ(info.source, "mpirun");
  EXPECT_EQ(info.rank, 3);
  vars.erase("OMPI_COMM_WORLD_RANK");
  vars.erase("OMPI_COMM_WORLD_SIZE");
  info = DiscoverLaunchInfo(Fake(vars));
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 32);
}

TEST(LaunchEnv, JobTokenFromLauncherIdentities) {
  EXPECT_EQ(FindJobToken(Fake({{"SLURM_JOB_ID", "12"}, {"SLURM_STEP_ID", "3"}})), "slurm:12.3");
  EXPECT_EQ(FindJobToken(Fake({{"PMIX_NAMESPACE", "prterun-x-1@1"}})), "pmix:prterun-x-1@1");
  EXPECT_EQ(FindJobToken(Fake({{"OMPI_MCA_ess_base_jobid", "99"}})), "ompi:99");
  EXPECT_EQ(FindJobToken(Fake({{"TORCHELASTIC_RUN_ID", "abc"}})), "torchelastic:abc");
  EXPECT_EQ(FindJobToken(Fake({{"CORTADO_JOB_TOKEN", "mine"}, {"SLURM_JOB_ID", "12"}})), "mine");
  EXPECT_FALSE(FindJobToken(Fake({})).has_value());
}

TEST(LaunchEnv, MissingTokenNamesTheVariableToSet) {
  std::string e = ErrorOf([] {
    DiscoverLaunchInfo(Fake({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "5"}}));
  });
  EXPECT_NE(e.find("CORTADO_JOB_TOKEN"), std::string::npos) << e;
}

// A derived port must never fall in Linux's ephemeral range (32768-60999), where another
// process's outgoing connection can hold it when rank 0 comes to listen (a CI run lost the
// mpirun test to exactly that).
TEST(LaunchEnv, DerivedPortsStayBelowTheEphemeralRange) {
  for (int job = 0; job < 2000; ++job) {
    LaunchInfo info = DiscoverLaunchInfo(Fake({{"OMPI_COMM_WORLD_RANK", "0"},
                                               {"OMPI_COMM_WORLD_SIZE", "2"},
                                               {"PMIX_NAMESPACE", "job-" + std::to_string(job)}}));
    ASSERT_GE(info.master_port, 20000) << job;
    ASSERT_LT(info.master_port, 32768) << job;
  }
}

TEST(LaunchEnv, MpirunAndSlurmDeriveMasterAndPort) {
  LaunchInfo mpi = DiscoverLaunchInfo(Fake({{"OMPI_COMM_WORLD_RANK", "1"},
                                            {"OMPI_COMM_WORLD_SIZE", "2"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                            {"PMIX_NAMESPACE", "job-7"}}));
  EXPECT_EQ(mpi.master_addr, "127.0.0.1");
  EXPECT_GE(mpi.master_port, 20000);
  EXPECT_LT(mpi.master_port, 32768);
  EXPECT_EQ(mpi.local_world_size, 2);
  LaunchInfo slurm = DiscoverLaunchInfo(Fake({{"SLURM_PROCID", "3"},
                                              {"SLURM_NTASKS", "8"},
                                              {"SLURM_LOCALID", "1"},
                                              {"SLURM_NTASKS_PER_NODE", "2(x4)"},
                                              {"SLURM_JOB_NODELIST", "gpu[07-10],cpu1"},
                                              {"SLURM_JOB_ID", "5"}}));
  EXPECT_EQ(slurm.master_addr, "gpu07");
  EXPECT_EQ(slurm.local_rank, 1);
  EXPECT_EQ(slurm.local_world_size, 2);
  EXPECT_EQ(slurm.job_token, "slurm:5.0");
}

TEST(LaunchEnv, MalformedValuesAreNamed) {
  std::string e = ErrorOf([] {
    DiscoverLaunchInfo(Fake({{"CORTADO_RANK", "2"}, {"CORTADO_WORLD_SIZE", "2"}}));
  });
  EXPECT_NE(e.find("CORTADO_RANK='2'"), std::string::npos) << e;
  e = ErrorOf([] { DiscoverLaunchInfo(Fake({{"CORTADO_RANK", "0"}})); });
  EXPECT_NE(e.find("CORTADO_WORLD_SIZE"), std::string::npos) << e;
}

TEST(CommOptions, ReadFromEnvironment) {
  CommOptions o = CommOptions::FromEnv(Fake({{"CORTADO_TIMEOUT_S", "2.5"},
                                             {"CORTADO_BACKEND", "mpi"},
                                             {"CORTADO_ALLREDUCE_ALGO", "hd"},
                                             {"CORTADO_CHUNK_BYTES", "1M"},
                                             {"CORTADO_SOCKET_BUFFER", "4M"},
                                             {"CORTADO_SOCKET_IFNAME", "lo"},
                                             {"CORTADO_SPIN_US", "0"}}));
  EXPECT_EQ(o.timeout.count(), 2500);
  EXPECT_EQ(o.backend, Backend::kMpi);
  EXPECT_EQ(o.allreduce_algorithm, Algorithm::kHalvingDoubling);
  EXPECT_EQ(o.chunk_bytes, 1u << 20);
  EXPECT_EQ(o.socket_buffer_bytes, 4 << 20);
  EXPECT_EQ(o.socket_ifname, "lo");
  EXPECT_EQ(o.spin_us, 0);
  EXPECT_NE(ErrorOf([] {
              CommOptions::FromEnv(Fake({{"CORTADO_BACKEND", "ucx"}}));
            }).find("CORTADO_BACKEND='ucx'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              CommOptions::FromEnv(Fake({{"CORTADO_TIMEOUT_S", "soon"}}));
            }).find("CORTADO_TIMEOUT_S"),
            std::string::npos);
  // 4G does not fit setsockopt's int: it is refused, not wrapped to 0.
  const std::string e = ErrorOf([] {
    CommOptions::FromEnv(Fake({{"CORTADO_SOCKET_BUFFER", "4G"}}));
  });
  EXPECT_NE(e.find("CORTADO_SOCKET_BUFFER: 4294967296 bytes is more than"), std::string::npos) << e;
  EXPECT_EQ(CommOptions::FromEnv(Fake({{"CORTADO_SOCKET_BUFFER", "1G"}})).socket_buffer_bytes,
            1 << 30);
}

TEST(CommOptions, TransportIsSeparateFromBackend) {
  CommOptions o = CommOptions::FromEnv(Fake({}));
  EXPECT_EQ(o.backend, Backend::kCortado);
  EXPECT_EQ(o.transport, TransportKind::kTcp);
  o = CommOptions::FromEnv(Fake({{"CORTADO_TRANSPORT", "ucx"}}));
  EXPECT_EQ(o.transport, TransportKind::kUcx);
  EXPECT_STREQ(TransportKindName(o.transport), "ucx");
  // The value from before CORTADO_TRANSPORT existed still means Cortado's collectives.
  o = CommOptions::FromEnv(Fake({{"CORTADO_BACKEND", "tcp"}, {"CORTADO_TRANSPORT", "ucx"}}));
  EXPECT_EQ(o.backend, Backend::kCortado);
  EXPECT_EQ(o.transport, TransportKind::kUcx);
  EXPECT_STREQ(BackendName(Backend::kCortado), "cortado");
  const std::string ucx_as_backend = ErrorOf([] {
    CommOptions::FromEnv(Fake({{"CORTADO_BACKEND", "ucx"}}));
  });
  EXPECT_NE(ucx_as_backend.find("CORTADO_TRANSPORT=ucx"), std::string::npos) << ucx_as_backend;
  const std::string bad = ErrorOf([] {
    CommOptions::FromEnv(Fake({{"CORTADO_TRANSPORT", "ib"}}));
  });
  EXPECT_NE(bad.find("CORTADO_TRANSPORT='ib' is not one of: tcp, ucx"), std::string::npos) << bad;
}

TEST(ByteSizes, ParseAndFormat) {
  EXPECT_EQ(ParseByteSize("4K"), 4096u);
  EXPECT_EQ(ParseByteSize("64M"), 64u << 20);
  EXPECT_EQ(ParseByteSize("1G"), 1u << 30);
  EXPECT_EQ(ParseByteSize("100"), 100u);
  EXPECT_EQ(ParseByteSize("8KiB"), 8192u);
  EXPECT_EQ(FormatByteSize(128u << 20), "128M");
  EXPECT_NE(ErrorOf([] { ParseByteSize("lots"); }).find("lots"), std::string::npos);
}

TEST(Types, HalfConversionRoundsToNearestEven) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 1000.5f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
  }
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), FloatToHalf(1.0f));  // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3c02);             // tie -> even (up)
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(70000.0f))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(3.0f)), 3.0f);
  EXPECT_EQ(FloatToBFloat16(1.0f + 1.0f / 256), FloatToBFloat16(1.0f));  // tie -> even
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
  EXPECT_EQ(ParseDataType("bf16"), DataType::kBF16);
  for (const char* name : {"f64", "float64", "double"}) {
    EXPECT_EQ(ParseDataType(name), DataType::kF64) << name;
  }
  EXPECT_EQ(DataTypeSize(DataType::kF64), 8u);
  EXPECT_STREQ(DataTypeName(DataType::kF64), "f64");
  EXPECT_EQ(static_cast<int>(DataType::kF64), 3);
  try {
    ParseDataType("f128");
    ADD_FAILURE() << "f128 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f64"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ParseReduceOp("avg"), ReduceOp::kAvg);
}

}  // namespace
}  // namespace cortado::dist
